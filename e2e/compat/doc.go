// Package compat holds the compatibility matrix test: every real-client driver of e2e/drivers,
// unmodified, through the proxy (started in-process) against a real Apache Pulsar broker.
//
// Contract:
//   - TestMatrix runs, for each driver, the cells listed in columns (matrix_test.go): produce and consume on a
//     non-partitioned and a partitioned topic with batching on and off, the four subscription
//     types, chunked messages, a JSON schema, redelivery after a negative ack, token
//     authentication (a good token accepted, a bad one refused with the same error the client
//     reports when it talks to the broker directly), and a topic whose lookup the broker
//     redirects to a second broker (harness.SetUpRedirect): the messages are stored on the
//     second broker, and the proxy's log shows it followed the redirect for that topic.
//   - The redirect's precondition (the broker answers LOOKUP with Redirect to the second broker)
//     is checked on the broker directly before any driver runs; if it does not hold, the test
//     fails.
//   - Each cell is pass, FAIL or unsupported. A cell is unsupported only when the driver itself
//     refused the request with its "unsupported" exit (the client version, or its driver, lacks the feature) and
//     the driver table (drivers.Driver.Supports) agrees; a refusal the table does not expect is a
//     FAIL. Unsupported never counts as pass.
//   - Every check reads what really happened: the client's acks and deliveries, and what the
//     broker stored (entries read back over the admin REST API, the registered schema).
//   - The test fails if any cell is FAIL, and fails (never skips) when a broker, a driver or the
//     proxy cannot be started.
//   - A run over every driver writes MATRIX.md beside this file; with -update-readme it also
//     splices that file into the repository README between the compat-matrix markers.
//     TestReadmeMatchesMatrix fails when the README's copy differs from MATRIX.md.
package compat

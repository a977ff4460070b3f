package proxy

import "testing"

// Given service URLs as operators and clients spell them,
// when each is turned into a broker address,
// then both schemes give host:port (6650 and 6651 by default) and anything else is refused.
func TestBrokerAddressTakesBothSchemes(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"pulsar://broker:6650", "broker:6650"},
		{"pulsar://broker", "broker:6650"},
		{"pulsar+ssl://broker:7651", "broker:7651"},
		{"pulsar+ssl://broker", "broker:6651"},
		{" 10.0.0.1:6650 ", "10.0.0.1:6650"},
		{"pulsar://[::1]:6650", "[::1]:6650"},
		{"http://broker:8080", ""},
		{"pulsar://:6650", ""},
		{"pulsar://broker:99999", ""},
	} {
		got, err := BrokerAddress(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("BrokerAddress(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("BrokerAddress(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

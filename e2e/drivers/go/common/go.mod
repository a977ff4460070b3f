// This go.mod only fences the shared driver source off from the repository's root module. The
// files here are never compiled in this directory: each ../v*/ module links them (see ../gen.sh).
module github.com/rebatchproxy/rebatchproxy/e2e/drivers/go/common

go 1.26

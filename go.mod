module github.com/rebatchproxy/rebatchproxy

go 1.26

package proxy

import (
	"io"
	"net"
)

func ioReadFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

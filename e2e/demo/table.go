package main

import (
	"fmt"
	"io"
	"strings"
)

// row is one measured quantity, directly and through the proxy. want, when set, says whether the
// proxy's figure shows the policy's effect.
type row struct {
	what          string
	direct, proxy string
	want          func(proxy string) bool
}

// table collects the workloads' rows, in order.
type table struct {
	lines [][3]string
}

func (t *table) section(name, title string, rows []row) {
	t.lines = append(t.lines, [3]string{name + ": " + title, "", ""})
	for _, r := range rows {
		t.lines = append(t.lines, [3]string{"    " + r.what, r.direct, r.proxy})
	}
}

func (t *table) print(w io.Writer) {
	width := len("what the broker stored, what consumers saw")
	for _, l := range t.lines {
		if l[1] != "" && len(l[0]) > width {
			width = len(l[0])
		}
	}
	line := func(a, b, c string) { fmt.Fprintf(w, "%-*s  %10s  %17s\n", width, a, b, c) }
	fmt.Fprintln(w)
	line("what the broker stored, what consumers saw", "directly", "through the proxy")
	fmt.Fprintln(w, strings.Repeat("-", width+31))
	for _, l := range t.lines {
		if l[1] == "" && l[2] == "" {
			fmt.Fprintln(w, l[0])
			continue
		}
		line(l[0], l[1], l[2])
	}
	fmt.Fprintln(w)
}

func itoa(n int) string { return fmt.Sprint(n) }

func ratio(a, b int) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(a)/float64(b))
}

// zero is a want: the proxy's figure is 0.
func zero(s string) bool { return s == "0" }

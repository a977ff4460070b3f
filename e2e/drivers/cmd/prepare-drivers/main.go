// Command prepare-drivers builds or installs the e2e client drivers into their cache (see
// ../../README.md). With no arguments it prepares every driver; otherwise the named ones.
//
//	go run ./e2e/drivers/cmd/prepare-drivers [-list] [name ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
)

func main() {
	list := flag.Bool("list", false, "list the drivers and what each lacks, prepare nothing")
	timeout := flag.Duration("timeout", 30*time.Minute, "overall bound")
	flag.Parse()
	all, err := drivers.All()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	selected := all
	if flag.NArg() > 0 {
		selected = nil
		for _, n := range flag.Args() {
			d, err := drivers.ByName(n)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			selected = append(selected, d)
		}
	}
	if *list {
		for _, d := range selected {
			fmt.Printf("%-16s lacks: %v\n", d.Name, d.Unsupported())
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	failed := 0
	for _, d := range selected {
		t := time.Now()
		if err := d.Prepare(ctx); err != nil {
			failed++
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", d.Name, err)
			continue
		}
		fmt.Printf("ok   %-16s %6.1fs\n", d.Name, time.Since(t).Seconds())
	}
	fmt.Printf("prepared %d of %d drivers in %.1fs\n", len(selected)-failed, len(selected), time.Since(start).Seconds())
	if failed > 0 {
		os.Exit(1)
	}
}

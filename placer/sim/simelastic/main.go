package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/placer/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simelastic:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simelastic", flag.ContinueOnError)
	nodes := fs.Int("nodes", 16, "cluster size, 8-GPU nodes")
	seeds := fs.Int("seeds", 3, "seeds 1..N for every shape and mode")
	only := fs.String("shape", "", "run only the shapes whose name contains this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes <= 0 || *seeds <= 0 {
		return fmt.Errorf("parse flags: -nodes and -seeds must be above zero")
	}
	var shapes []sim.ElasticShape
	for _, sh := range sim.ElasticSuite(*nodes) {
		if strings.Contains(sh.Name, *only) {
			shapes = append(shapes, sh)
		}
	}
	if len(shapes) == 0 {
		return fmt.Errorf("parse flags: -shape %q matches no shape", *only)
	}
	start := time.Now()
	rows := sim.RunElasticSuite(shapes, sim.SeedList(*seeds))
	c := sim.DefaultElasticCost
	fmt.Printf("%d nodes of 8 GPUs, a pass every minute, 24 h of arrivals, seeds 1–%d; a resize: %v rate limit, %v checkpoint, %v restart; %s in all.\n\n",
		*nodes, *seeds, c.Interval, c.Checkpoint, c.Restart, time.Since(start).Round(time.Second))
	fmt.Print(sim.ElasticTable(rows))
	return nil
}

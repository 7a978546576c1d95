package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/placer/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simpower:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simpower", flag.ContinueOnError)
	sizes := fs.String("nodes", "16,200", "cluster sizes, comma-separated")
	hours := fs.Float64("hours", 1, "factor on each shape's 24 simulated hours")
	seeds := fs.Int("seeds", 1, "seeds 1..N for every shape and strategy")
	only := fs.String("shape", "", "run only the shapes whose name contains this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *hours <= 0 || *seeds <= 0 {
		return fmt.Errorf("parse flags: -hours and -seeds must be above zero")
	}
	cfg, err := config.Load(nil, nil)
	if err != nil {
		return fmt.Errorf("load default settings: %w", err)
	}
	opt := placer.PlanOptions{ReserveAfter: cfg.PlacerReserveAfter}
	ss := sim.SeedList(*seeds)
	start := time.Now()
	var rows []sim.SuiteRow
	ns, err := sim.ParseSizes(*sizes)
	if err != nil {
		return err
	}
	for _, n := range ns {
		shapes := sim.Matching(sim.PowerShapes(n, *hours), *only)
		rows = append(rows, sim.RunSuite(shapes, opt, []placer.Strategy{placer.Binpack, placer.Pack, placer.Spread}, ss)...)
	}
	fmt.Printf("Default settings (ReserveAfter %v), a pass every %v, hours ×%g, seeds 1–%d; %s in all.\n\n", opt.ReserveAfter, sim.SuiteTick, *hours, *seeds, time.Since(start).Round(time.Second))
	fmt.Print(sim.PowerTable(rows))
	return nil
}

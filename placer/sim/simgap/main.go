package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/placer/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simgap:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simgap", flag.ContinueOnError)
	nodes := fs.Int("nodes", 16, "cluster size")
	hours := fs.Float64("hours", 0.25, "factor on each shape's simulated hours")
	seeds := fs.Int("seeds", 1, "seeds 1..N for every shape and strategy")
	only := fs.String("shape", "", "run only the shapes whose name contains this")
	strategies := fs.String("strategies", "binpack,spread", "strategies, comma-separated")
	pop := fs.Int("population", 40, "ε-NSGA-II's population")
	gens := fs.Int("generations", 60, "ε-NSGA-II's generations")
	limit := fs.Int("search-limit", 5000, "sessions above which ε-NSGA-II is not run (the rolling search and the bound still are)")
	window := fs.Int("window", 30, "the rolling search's window, in passes")
	look := fs.Int("lookahead", 60, "the rolling search's lookahead beyond a window, in passes")
	wpop := fs.Int("window-population", 16, "the rolling search's population in each window")
	wgens := fs.Int("window-generations", 12, "the rolling search's generations in each window (-1: none, the best seed order is committed)")
	wseeds := fs.String("window-seeds", "", "the rolling search's seed orders, comma-separated (empty: all of "+strings.Join(sim.WindowSeeds, ", ")+")")
	wins := fs.Bool("orders", false, "after the table, which seed order each run's rolling search committed in how many windows, and each order's mean wait alone")
	shortFirst := fs.Bool("short-first", false, "order each owner's requests shortest declared max runtime first, aged (PlanOptions.ShortFirst)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes <= 0 || *hours <= 0 || *seeds <= 0 {
		return fmt.Errorf("parse flags: -nodes, -hours and -seeds must be above zero")
	}
	cfg, err := config.Load(nil, nil)
	if err != nil {
		return fmt.Errorf("load default settings: %w", err)
	}
	opt := placer.PlanOptions{ReserveAfter: cfg.PlacerReserveAfter, ShortFirst: *shortFirst}
	var sts []placer.Strategy
	for _, s := range strings.Split(*strategies, ",") {
		switch st := placer.Strategy(strings.TrimSpace(s)); st {
		case placer.Binpack, placer.Spread:
			sts = append(sts, st)
		default:
			return fmt.Errorf("parse -strategies %q: want binpack or spread", s)
		}
	}
	var seedNames []string
	if *wseeds != "" {
		for _, n := range strings.Split(*wseeds, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(sim.WindowSeeds, n) {
				return fmt.Errorf("parse -window-seeds %q: want some of %s", n, strings.Join(sim.WindowSeeds, ", "))
			}
			seedNames = append(seedNames, n)
		}
	}
	shapes := sim.Matching(sim.Suite(*nodes, *hours), *only)
	ss := sim.SeedList(*seeds)
	start := time.Now()
	rows := sim.RunGaps(shapes, opt, sts, ss, sim.GapOptions{
		Search:      sim.SearchOptions{Population: *pop, Generations: *gens},
		SearchLimit: *limit,
		Window:      sim.WindowOptions{Window: *window, Lookahead: *look, Population: *wpop, Generations: *wgens, Seeds: seedNames},
		Orders:      *wins,
	})
	fmt.Printf("%d nodes, hours ×%g, default settings (ReserveAfter %v), a pass every %v, seeds 1–%d; ε-NSGA-II population %d, %d generations up to %d sessions; rolling search windows of %d passes, lookahead %d, population %d, %d generations; %s in all.\n\n",
		*nodes, *hours, opt.ReserveAfter, sim.SuiteTick, *seeds, *pop, *gens, *limit, *window, *look, *wpop, *wgens, time.Since(start).Round(time.Second))
	fmt.Print(sim.GapTable(rows))
	if *wins {
		fmt.Println()
		for _, r := range rows {
			if r.RollingWins != nil {
				fmt.Printf("- %d %s %s seed %d: windows won by each order %v; mean wait by each order alone:", r.Shape.Nodes, r.Shape.Name, r.Strategy, r.Seed, r.RollingWins)
				for _, n := range sim.WindowSeeds {
					if w, ok := r.Orders[n]; ok {
						fmt.Printf(" %s %.2f;", n, w)
					}
				}
				fmt.Println()
			}
		}
	}
	for _, r := range rows {
		if r.Err != nil {
			return fmt.Errorf("%s %s seed %d: %w", r.Shape.Name, r.Strategy, r.Seed, r.Err)
		}
	}
	return nil
}

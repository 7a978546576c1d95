package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/placer/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simsuite:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simsuite", flag.ContinueOnError)
	sizes := fs.String("nodes", "16,200,2000", "cluster sizes, comma-separated")
	seeds := fs.Int("seeds", 3, "seeds 1..N for every shape and strategy")
	hours := fs.String("hours", "16=1,200=1,2000=0.25", "size=factor on each shape's simulated hours")
	only := fs.String("shape", "", "run only the shapes whose name contains this")
	trace := fs.Bool("trace", false, "print every pass whose Jain's index is below the goal (users' GPUs held, waiting and fair share; nodes held), to stderr")
	trace8 := fs.Int("trace-8", 0, "print every pass that leaves at least this many 8-GPU requests waiting (requests waiting by size, each user's 8-GPU requests), to stderr; 0: none")
	extra := fs.Bool("extra", false, "run the shapes outside the suite (sim.ExtraShapes: workloads the policy was not tuned on) instead of the suite")
	mixed := fs.Bool("mixed", false, "run the shapes on machines of two sizes (sim.MixedShapes: 8-GPU machines beside 4- or 2-GPU ones) instead of the suite")
	uniform := fs.Bool("uniform", false, "with -mixed, every machine 8-GPU at the same loads: the control")
	teams := fs.Bool("teams", false, "run issue 36's team shapes (sim.TeamSuite, binpack) at the first size instead")
	shortFirst := fs.Bool("short-first", false, "order each owner's requests shortest declared max runtime first, aged (PlanOptions.ShortFirst)")
	noEstimates := fs.Bool("no-estimates", false, "give the planner no run times learned from finished sessions (sim.Config.NoEstimates): nodes drain by max runtimes alone")
	tick := fs.Duration("tick", 0, "plan every this much simulated time instead of the suite's pass (sim.SuiteTick); the p99 8/1 floor is one pass of it")
	noLimits := fs.Bool("no-limits", false, "no session declares a max runtime (every stream's sim.Stream.NoLimit), as from a client that never sets one; with -no-estimates the planner knows nothing of when a session ends")
	without := fs.String("without", "", "turn these of issue 34's rules off, comma-separated, the rest of the policy as it is (PlanOptions.Without): reserve (the standing reserve), claims, drainfit, bands (spread's bands and packing), lend (lending only short work), transfer (draining nodes of owners above their share for those below it); what a rule buys is the same runs without it")
	reserveAfter := fs.Duration("reserve-after", -1, "plan with this PlanOptions.ReserveAfter instead of the default setting (VOYAGER_PLACER_RESERVE_AFTER); 0: holds, the standing reserve, claims, spread's bands, the drain fit and lending off, the policy without issue 34's rules for large requests; negative: the default")
	declare := fs.Duration("declare", 0, "every session that declares a max runtime declares this one, whatever it runs for (sim.Config.DeclaredLimit: max runtimes that tell the planner nothing, such as 72h); 0: the first rung of the ladder at least its run time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(nil, nil)
	if err != nil {
		return fmt.Errorf("load default settings: %w", err)
	}
	rules, err := placer.ParseRules(*without)
	if err != nil {
		return fmt.Errorf("parse -without: %w", err)
	}
	opt := placer.PlanOptions{ReserveAfter: cfg.PlacerReserveAfter, ShortFirst: *shortFirst, Without: rules}
	if *reserveAfter >= 0 {
		opt.ReserveAfter = *reserveAfter
	}
	heading := settings(opt, *reserveAfter)
	factor := map[int]float64{}
	for _, kv := range strings.Split(*hours, ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err1 := strconv.Atoi(k)
		f, err2 := strconv.ParseFloat(v, 64)
		if !ok || err1 != nil || err2 != nil || f <= 0 {
			return fmt.Errorf("parse -hours %q: want size=factor pairs such as 2000=0.25", kv)
		}
		factor[n] = f
	}
	ss := sim.SeedList(*seeds)
	if *teams {
		return runTeams(opt, heading, *sizes, *only, ss)
	}
	var rows []sim.SuiteRow
	start := time.Now()
	ns, err := sim.ParseSizes(*sizes)
	if err != nil {
		return err
	}
	for _, n := range ns {
		f, ok := factor[n]
		if !ok {
			f = 1
		}
		var all []sim.Shape
		switch {
		case *extra:
			all = sim.ExtraShapes(n, f)
		case *mixed:
			all = sim.MixedShapes(n, f, *uniform)
		default:
			all = append(sim.Suite(n, f), sim.ShareSuite(n, f)...)
		}
		shapes := sim.Matching(all, *only)
		if *trace || *trace8 > 0 {
			for i := range shapes {
				shapes[i] = traced(shapes[i], *trace, *trace8)
			}
		}
		if ov := (overrides{declare: *declare, tick: *tick, noEstimates: *noEstimates, noLimits: *noLimits}); ov != (overrides{}) {
			for i := range shapes {
				shapes[i] = ov.apply(shapes[i])
			}
		}
		t := time.Now()
		rows = append(rows, sim.RunSuite(shapes, opt, []placer.Strategy{placer.Binpack, placer.Spread}, ss)...)
		fmt.Fprintf(os.Stderr, "simsuite: %d nodes (hours ×%g) in %v\n", n, f, time.Since(t).Round(time.Second))
	}
	fmt.Printf("%s (ReserveAfter %v), a pass every %v, seeds 1–%d; %s in all.\n\n", heading, opt.ReserveAfter, cmp.Or(*tick, sim.SuiteTick), *seeds, time.Since(start).Round(time.Second))
	fmt.Print(sim.SuiteTable(rows, sim.IssueGoals))
	// Issue 34's goals are asked of its shapes; the sharing shapes of
	// issue 35 have a table of their own.
	var shared []sim.SuiteRow
	missed, judged := 0, 0
	for _, r := range rows {
		if strings.HasPrefix(r.Shape.Name, "frac-") {
			shared = append(shared, r)
			continue
		}
		judged++
		if len(r.Misses(sim.IssueGoals)) > 0 {
			missed++
		}
	}
	if len(shared) > 0 {
		fmt.Printf("\nSharing (issue 35):\n\n%s", sim.ShareTable(shared))
	}
	fmt.Printf("\n%d of %d runs of issue 34's shapes miss a goal.\n", missed, judged)
	if missed > 0 {
		os.Exit(1)
	}
	return nil
}

// overrides are the flags that change what every shape's runs tell the
// planner or how often it plans.
type overrides struct {
	// declare is the max runtime every session that declares one
	// declares (sim.Config.DeclaredLimit); tick the time between passes
	// (sim.Config.Tick); zero leaves either as the shape has it.
	declare, tick time.Duration
	// noEstimates gives the planner no run times learned
	// (sim.Config.NoEstimates); noLimits has no session declare a max
	// runtime (sim.Stream.NoLimit).
	noEstimates, noLimits bool
}

// apply is sh with o applied to every run it builds.
func (o overrides) apply(sh sim.Shape) sim.Shape {
	build := sh.Build
	sh.Build = func(opt placer.PlanOptions, seed uint64) sim.Config {
		c := build(opt, seed)
		if o.declare > 0 {
			c.DeclaredLimit = o.declare
		}
		if o.tick > 0 {
			c.Tick = o.tick
		}
		c.NoEstimates = c.NoEstimates || o.noEstimates
		if o.noLimits {
			c.Streams = slices.Clone(c.Streams)
			for i := range c.Streams {
				c.Streams[i].NoLimit = true
			}
		}
		return c
	}
	return sh
}

// traced is sh with every pass below the Jain goal (if jain) and every
// pass leaving at least eights 8-GPU requests waiting (if eights > 0)
// written to stderr.
func traced(sh sim.Shape, jain bool, eights int) sim.Shape {
	build := sh.Build
	sh.Build = func(o placer.PlanOptions, seed uint64) sim.Config {
		c := build(o, seed)
		c.Trace = func(p sim.Pass) {
			bySize, eight := map[int]int{}, map[string]int{}
			for _, w := range p.Plan.Waiting {
				g := w.Pending.Entry.Request.GPUs
				bySize[g]++
				if g == 8 {
					eight[w.Pending.Entry.Owner]++
				}
			}
			low := jain && p.Jain < sim.IssueGoals.JainMin
			many := eights > 0 && bySize[8] >= eights
			if !low && !many {
				return
			}
			users := make([]string, 0, len(p.Fair))
			for u := range p.Fair {
				users = append(users, u)
			}
			sort.Strings(users)
			var b strings.Builder
			for _, u := range users {
				fmt.Fprintf(&b, " %s %.0f/%.0f (+%.0f waiting", u, float64(p.Held[u])/1000, p.Fair[u]/1000, float64(p.Waiting[u])/1000) // GPUs, from thousandths
				if many {
					fmt.Fprintf(&b, ", %d×8", eight[u])
				}
				b.WriteString(")")
			}
			if b.Len() > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(os.Stderr, "trace %d %s %s seed %d at %v: Jain %.3f;%s free %d, 8-GPU slots %d, %d nodes held (%d GPUs free on them), %d of the standing reserve with GPUs free",
				sh.Nodes, sh.Name, o.Strategy, seed, p.Now, p.Jain, b.String(), p.Free, p.Slots8, p.Reserved, p.HeldFree, len(p.Plan.Standing))
			if many {
				sizes := make([]int, 0, len(bySize))
				for g := range bySize {
					sizes = append(sizes, g)
				}
				sort.Ints(sizes)
				b.Reset()
				for _, g := range sizes {
					fmt.Fprintf(&b, " %d×%d", bySize[g], g)
				}
				fmt.Fprintf(os.Stderr, "; waiting (requests × GPUs):%s", b.String())
				if k := bySize[8]; k > 0 && k <= len(p.Drains) {
					fmt.Fprintf(os.Stderr, "; %d nodes whole by true run times in %v", k, p.Drains[k-1].Round(time.Minute))
				}
			}
			fmt.Fprintln(os.Stderr)
		}
		return c
	}
	return sh
}

// settings names the planner's settings in a table's heading: the
// defaults, or what -reserve-after and -without changed of them.
func settings(opt placer.PlanOptions, reserveAfter time.Duration) string {
	s := "Default settings"
	if reserveAfter >= 0 {
		s += " but -reserve-after"
	}
	if opt.Without != 0 {
		s += " without " + opt.Without.String()
	}
	return s
}

// runTeams runs sim.TeamSuite at the first of sizes and prints its table
// under heading (settings).
func runTeams(opt placer.PlanOptions, heading, sizes, only string, seeds []uint64) error {
	ns, err := sim.ParseSizes(sizes)
	if err != nil {
		return err
	}
	n := ns[0]
	shapes := sim.Matching(sim.TeamSuite(n), only)
	start := time.Now()
	rows := sim.RunTeams(shapes, opt, seeds)
	fmt.Printf("%d nodes, %s (ReserveAfter %v), preemption grace 2m, a pass every %v, seeds 1–%d; %s in all.\n\n", n, strings.ToLower(heading), opt.ReserveAfter, sim.SuiteTick, len(seeds), time.Since(start).Round(time.Second))
	fmt.Print(sim.TeamTable(rows))
	return nil
}

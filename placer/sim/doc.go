// Package sim is a discrete-event simulator of GPU placement under churn.
//
// It drives placer.NewPlan directly — no etcd, no agents — over a simulated
// cluster of identical GPU nodes: sessions arrive by seeded Poisson
// streams (steady users, a user who floods, bursts of large requests,
// Ray gangs), each runs for a time drawn from a distribution, and every
// Tick of simulated time the whole queue is planned once and the bound
// decisions start. The same Config and seed always give the same Result.
//
// Result reports what a shared cluster is judged by when there are not
// enough GPUs: Jain's fairness index over users with waiting work, each
// user's share, queueing time by request size (mean and p99, sessions
// still waiting at the end counted with their wait so far), utilisation
// while work waits, idle GPUs by cause (held for a waiting request, or
// fragmented), and the 8-GPU slots free against floor(free GPUs / 8).
//
// Suite is issue 34's suite of workload shapes (floods that drain, rising
// load, 8-GPU-only users, long and short jobs, weights, Ray gangs and
// shapes built to defeat holds) at a cluster size; RunSuite runs it for
// strategies and seeds, SuiteTable prints one table with each run's
// missed goals (IssueGoals), and the simsuite command (`make sim`) runs
// it at 16, 200 and 2,000 nodes. Config.Trace sees every pass of a run's
// window (each user's GPUs held, waiting and fair share, the nodes held,
// the plan): the figures' causes; `simsuite -trace` prints the passes
// below the Jain goal. ExtraShapes are sixteen more shapes outside the
// suite, built after the policy was set, to judge it on workloads it
// was not tuned on (`simsuite -extra`); MixedShapes put 8-GPU machines
// beside 4- or 2-GPU ones (Config.NodeGPUs), with a control of 8-GPU
// machines alone at the same loads (`simsuite -mixed`, `-mixed -uniform`).
//
// ShareSuite is issue 35's sharing workload: notebooks asking for
// fractions of shared GPUs (Config.SharedNodes, Size.ShareMiB) beside
// whole-GPU training, and its control with every notebook on a whole GPU;
// Result.Sharing says how many sessions ran, how fractions packed, and
// whether any shared GPU broke its rules; ShareTable prints it.
//
// The optimum to measure the planner against (issue 40): a run made with
// Config.Record becomes an Instance (NewInstance): its arrivals on the
// pass grid, each session's GPUs, parts and run time, and a fair-share
// slack, the run's own worst wait beyond fair share. Evaluate checks a
// Schedule and gives its three objectives (mean wait, active machines,
// GPUs stranded by fragmentation). Exact is a branch and bound over the
// active schedules of instances of up to ExactLimit sessions (checked
// against enumeration); Search is ε-NSGA-II on larger ones, deterministic
// by seed; OnlineFCFS and ClairvoyantFCFS are baselines that tell what a
// gap is made of. At 200 and 2,000 nodes, where neither reaches, LowerBound
// bounds every feasible schedule's wait and machines from below (checked
// against Exact), and RollingSearch, a rolling-horizon NSGA-II over a fast
// list scheduler with EASY reservations, finds a feasible schedule from
// above (FastFCFS gives the baselines at that size). RunGaps and GapTable
// measure the planner's gap between the two on every shape of the suite
// (simgap, `make sim-gap` and `make sim-gap-scale`). PowerShapes and PowerTable
// measure the pack strategy's active machines and waits against binpack
// and spread (simpower, `make sim-power`).
//
// Elastic jobs against fixed sizes (issue 40): RunElastic simulates jobs
// with a fixed amount of work and an Amdahl throughput per size, resized
// as the lifecycle controller resizes them (placer.PlanElastic; each
// resize a restart with its checkpoint, restart and rate limit), against
// the same arrivals fixed at their minimum and at their maximum, and with
// goodput reports (placer.ElasticOptions.Goodput). ElasticSuite,
// RunElasticSuite and ElasticTable make the table of mean and p99
// completion times (simelastic, `make sim-elastic`).
package sim

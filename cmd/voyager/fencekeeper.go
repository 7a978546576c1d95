package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/fence"
	"github.com/voyager-gpu/voyager/internal/config"
)

const fenceKeeperLong = `Watches the heartbeat that this machine's node agent writes to
<data dir>/fence after every renewal of its node lease, and stops the node's
session containers itself once the heartbeat's deadline has passed: when the
agent was killed, paused, or hangs in a call to containerd or etcd and so
cannot fence the node before its lease expires and the sessions run
elsewhere. It kills the containers' processes directly (SIGTERM, the fence
grace, SIGKILL), without asking the agent, containerd or etcd, and records
each fence for the agent to report. One keeper per data directory; a second
exits at once. The agent starts one for itself unless
VOYAGER_AGENT_FENCE_KEEPER says otherwise; deploy/systemd runs it as a
service of its own.`

func newFenceKeeperCmd() *cobra.Command {
	var exitWithAgent bool
	var agentPID int
	cmd := &cobra.Command{
		Use:     "fence-keeper",
		Short:   "Stop this node's containers when its agent cannot (killed, paused, hung)",
		Long:    fenceKeeperLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			log := cfg.NewLogger(cmd.ErrOrStderr()).With("component", "fence-keeper")
			if cfg.DataDir == "" {
				log.Error("voyager fence-keeper failed", "err", fmt.Sprintf("find data directory: neither XDG_DATA_HOME nor HOME is set; set %s", config.EnvDataDir))
				return exitCode(exitUsage)
			}
			k := &fence.Keeper{Dir: fenceDir(cfg), ExitWithAgent: exitWithAgent, AgentPID: agentPID, Logger: log}
			err = k.Run(cmd.Context())
			if errors.Is(err, fence.ErrAnotherKeeper) {
				log.Debug("another fence keeper watches this node; exiting", "dir", k.Dir)
				return nil
			}
			if err != nil {
				log.Error("voyager fence-keeper failed", "err", err)
				return exitCode(exitError)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&exitWithAgent, "exit-with-agent", false, "exit once the agent that wrote the heartbeat is gone and nothing it listed runs (a keeper the agent started for itself)")
	cmd.Flags().IntVar(&agentPID, "agent-pid", 0, "the agent that started this keeper, for as long as it wrote no heartbeat")
	_ = cmd.Flags().MarkHidden("agent-pid")
	return withSettings(cmd, config.EnvDataDir, config.EnvLogLevel, config.EnvLogFormat)
}

// fenceDir is the fence directory of cfg's data directory: the agent's
// heartbeat, the keeper's lock and the fence records.
func fenceDir(cfg config.Config) string { return filepath.Join(cfg.DataDir, "fence") }

// startFenceKeeper makes sure a fence keeper watches the agent's fence
// directory, as VOYAGER_AGENT_FENCE_KEEPER says: spawn starts
// `voyager fence-keeper` (this binary) in a session of its own, so that no
// signal to the agent's process group reaches it and it outlives the agent
// (it exits once the agent is gone and nothing it ran is left); external
// only checks that one runs; off does nothing. It returns a func that
// checks again (and spawns again a keeper that died): the agent calls it
// now and then.
func startFenceKeeper(cfg config.Config, log *slog.Logger) func() {
	dir := fenceDir(cfg)
	warned := false
	check := func() {
		switch cfg.AgentFenceKeeper {
		case "off":
			return
		case "external":
			if !fence.Held(dir) && !warned {
				warned = true
				log.Error("no fence keeper watches this node: killed or paused, this agent would leave its containers running past its lease (start voyager-fence-keeper.service, or set "+config.EnvAgentFenceKeeper+"=spawn)", "dir", dir)
			} else if fence.Held(dir) {
				warned = false
			}
			return
		}
		if fence.Held(dir) {
			return
		}
		if err := spawnFenceKeeper(dir, cfg, log); err != nil {
			log.Error("start the fence keeper: killed or paused, this agent would leave its containers running past its lease", "err", err)
		}
	}
	if cfg.AgentFenceKeeper == "off" {
		log.Warn("no out-of-process fence (" + config.EnvAgentFenceKeeper + "=off): killed or paused, this agent leaves its containers running past its lease")
	}
	check()
	return check
}

func spawnFenceKeeper(dir string, cfg config.Config, log *slog.Logger) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create fence directory: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(dir, "keeper.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("open keeper log: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(exe, "fence-keeper", "--exit-with-agent", "--agent-pid", strconv.Itoa(os.Getpid()))
	cmd.Env = append(os.Environ(), config.EnvDataDir+"="+cfg.DataDir, config.EnvLogFormat+"="+cfg.LogFormat)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s fence-keeper: %w", exe, err)
	}
	go func() { _ = cmd.Wait() }() // reaped if it exits while the agent lives
	// It is ready once it holds the lock.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if fence.Held(dir) {
			log.Debug("fence keeper started", "pid", cmd.Process.Pid, "dir", dir)
			return nil
		}
	}
	return fmt.Errorf("start fence keeper: it holds no lock on %s after 5s (its log: %s)", dir, out.Name())
}

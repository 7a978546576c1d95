package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/runtime"
)

const imageLoadLong = `Imports image archives (docker-archive or OCI tar files, such as the one
deploy/images/jupyter/build.sh writes) into the containerd of this machine's
node agent, in the agent's namespace, and unpacks them: the containerd at
VOYAGER_AGENT_CONTAINERD, else the private one voyager dev starts under its
data dir. make image builds voyager.local/jupyter:latest from Debian's
packages and runs this. Images under voyager.local/ are never pulled from a
registry: loading them is the only way in.`

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Short:   "Load images into this machine's containerd (make image uses it)",
		Long:    "Manages the images of this machine's node agent.",
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	load := &cobra.Command{
		Use:   "load ARCHIVE…",
		Short: "Import image archives into the agent's containerd",
		Long:  imageLoadLong,
		Example: `  make image     # builds voyager.local/jupyter:latest, then:
  voyager image load ~/.cache/voyager/images/voyager.local-jupyterlab.tar`,
		Args: cobra.MinimumNArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return []cobra.Completion{"tar"}, cobra.ShellCompDirectiveFilterFileExt
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			rt, addr, err := connectAgentContainerd(cmd.Context(), cfg)
			if err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
				return exitCode(exitError)
			}
			defer rt.Close()
			for _, path := range args {
				names, err := importArchive(cmd.Context(), rt, path)
				if err != nil {
					fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
					return exitCode(exitError)
				}
				for _, n := range names {
					fmt.Fprintf(cmd.OutOrStdout(), "loaded %s into containerd at %s (namespace %s)\n", n, addr, cfg.AgentNamespace)
				}
			}
			return nil
		},
	}
	withSettings(load, config.EnvAgentContainerd, config.EnvAgentNamespace, config.EnvDataDir)
	cmd.AddCommand(load)
	return cmd
}

func importArchive(ctx context.Context, rt *runtime.Containerd, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image archive: %w", err)
	}
	defer f.Close()
	names, err := rt.Import(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return names, nil
}

// devContainerdDir is where voyager dev starts its private containerd
// when none answers at VOYAGER_AGENT_CONTAINERD.
func devContainerdDir(cfg config.Config) string {
	return filepath.Join(cfg.DataDir, "containerd")
}

// connectAgentContainerd connects to the containerd the node agent uses:
// the configured one, else voyager dev's private one. It returns the
// socket it reached.
func connectAgentContainerd(ctx context.Context, cfg config.Config) (*runtime.Containerd, string, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := runtime.ContainerdOptions{Address: cfg.AgentContainerd, Namespace: cfg.AgentNamespace, Logger: quiet}
	rt, err := runtime.NewContainerd(ctx, opts)
	if err == nil {
		return rt, opts.Address, nil
	}
	private := filepath.Join(devContainerdDir(cfg), "containerd.sock")
	opts.Address = private
	if rt, perr := runtime.NewContainerd(ctx, opts); perr == nil {
		return rt, private, nil
	}
	return nil, "", fmt.Errorf("connect to the agent's containerd: none answers at %s (%s) nor at %s (voyager dev's own, under %s): start voyager dev first (make dev), or set %s: %w",
		cfg.AgentContainerd, config.EnvAgentContainerd, private, config.EnvDataDir, config.EnvAgentContainerd, err)
}

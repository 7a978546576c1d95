"""python3 -m voyager_spawner: the spawner's own commands.

  help         every VoyagerSpawner option, as `jupyterhub --help-all`
               prints a spawner's (JupyterHub 3.0 leaves out the options of
               spawners registered by entry point; 5.2 and later list them)
  keygen PFX   write PFX.key (the hub's signing key, mode 0600) and PFX.pub
               (for Voyager's VOYAGER_JWT_PUBLIC_KEYS); --rsa for RSA
"""

import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m voyager_spawner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("help", help="print every VoyagerSpawner option")
    kg = sub.add_parser("keygen", help="write a signing key pair")
    kg.add_argument("prefix", help="writes PREFIX.key and PREFIX.pub")
    kg.add_argument("--rsa", action="store_true", help="RSA 3072 (RS256) instead of EC P-256 (ES256)")
    args = ap.parse_args(argv)
    if args.cmd == "help":
        from .spawner import VoyagerSpawner

        print(VoyagerSpawner.class_get_help())
        return 0
    from .tokens import keygen

    try:
        key, pub = keygen(args.prefix, "rsa" if args.rsa else "ec")
    except (OSError, ValueError) as e:
        print(f"keygen: {e}", file=sys.stderr)
        return 1
    print(f"wrote {key} (VoyagerSpawner.voyager_private_key_file) and {pub} (VOYAGER_JWT_PUBLIC_KEYS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

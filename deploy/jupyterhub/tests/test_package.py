"""The package as an administrator installs it: pip into a fresh virtual
environment that sees the system's JupyterHub, the `voyager` entry point
resolved by JupyterHub itself, and a README that documents every option.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)

from voyager_spawner import VoyagerSpawner  # noqa: E402


class PackageTest(unittest.TestCase):
    def test_pip_install_into_a_venv_registers_voyager(self):
        with tempfile.TemporaryDirectory() as d:
            # A clean copy: pip builds in the source tree.
            src = shutil.copytree(PKG, os.path.join(d, "src"),
                                  ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
            venv = os.path.join(d, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
            py = os.path.join(venv, "bin", "python")
            # The README's command; --no-index proves nothing is fetched.
            out = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", src],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            # JupyterHub resolves the name the way `spawner_class = "voyager"` does.
            probe = (
                "from jupyterhub.app import JupyterHub\n"
                "import voyager_spawner\n"
                "app = JupyterHub()\n"
                "app.spawner_class = 'voyager'\n"
                "c = app.spawner_class\n"
                "print(c.__module__, c.__name__, voyager_spawner.__file__)\n"
            )
            out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=d)
            self.assertEqual(out.returncode, 0, out.stderr)
            mod, name, path = out.stdout.split()
            self.assertEqual((mod, name), ("voyager_spawner.spawner", "VoyagerSpawner"))
            self.assertTrue(path.startswith(venv), f"imported from {path}, not the venv")
            # The options, in --help-all's format.
            out = subprocess.run([py, "-m", "voyager_spawner", "help"], capture_output=True, text=True, cwd=d)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("--VoyagerSpawner.voyager_private_key_file=<Unicode>", out.stdout)
            # keygen writes a pair the minter signs with.
            out = subprocess.run([py, "-m", "voyager_spawner", "keygen", os.path.join(d, "hub")],
                                 capture_output=True, text=True, cwd=d)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(os.path.exists(os.path.join(d, "hub.pub")))
            out = subprocess.run([py, "-m", "voyager_spawner", "keygen", os.path.join(d, "hub")],
                                 capture_output=True, text=True, cwd=d)
            self.assertEqual(out.returncode, 1, "keygen must not overwrite a key")

    def test_readme_documents_every_option(self):
        with open(os.path.join(PKG, "README.md")) as f:
            readme = f.read()
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", readme, re.M))
        options = set(VoyagerSpawner.class_own_traits(config=True))
        self.assertEqual(sorted(options - documented), [], "options missing from README.md's table")
        self.assertEqual(sorted(documented - options), [],
                         "README.md documents options that do not exist")
        for name, trait in VoyagerSpawner.class_own_traits(config=True).items():
            self.assertTrue(trait.help.strip(), f"{name} has no help: --help-all would show nothing")


if __name__ == "__main__":
    unittest.main()

"""JupyterLab for voyager.local/jupyter, without PyPI's jupyterlab package.

JupyterLab is two halves: a front end (the @jupyterlab packages of the npm
registry, bundled by webpack.config.js next to this package) and a Jupyter
Server extension that serves it with its settings, themes, workspaces and
translations. The second half is Debian's python3-jupyterlab-server
(jupyterlab_server.LabServerApp); VoyagerLab points it at the bundle that
the image build installs under DATA, and fills in what PyPI's jupyterlab
adds under JupyterHub (the page config that the hub extension reads for its
"Hub Control Panel" and "Log Out").

It is enabled for every Jupyter Server in the image by
/etc/jupyter/jupyter_server_config.d/voyager_lab.json, so that both
jupyterhub-singleuser and `jupyter lab` (this module's main) serve /lab.
"""

import getpass
import json
import os

import jupyter_server
from jupyter_core.paths import jupyter_config_dir
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from jupyterlab_server import LabServerApp
from tornado import web

# Where the image build puts the front end: static/ (the bundle), schemas/,
# themes/ and templates/.
DATA = os.environ.get("VOYAGER_LAB_DATA", "/usr/share/voyager-lab")
# Debian's libjs-mathjax (MathJax 2, which @jupyterlab/mathjax2-extension loads).
MATHJAX = "/usr/share/javascript/mathjax"


def _version():
    try:
        with open(os.path.join(DATA, "package.json"), encoding="utf-8") as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return ""


class IdentityHandler(APIHandler):
    """GET /api/me, which JupyterLab 3.6's front end asks for (Jupyter
    Server 2 answers it; Debian 12's 1.23 does not): who the user is, as
    the hub named him, else the account the server runs as."""

    @web.authenticated
    def get(self):
        user = self.current_user
        name = user.get("name", "") if isinstance(user, dict) else ""
        name = name or os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
        identity = {"username": name, "name": name, "display_name": name,
                    "initials": name[:1].upper(), "avatar_url": None, "color": None}
        self.finish(json.dumps({"identity": identity, "permissions": {}}))


class VoyagerLab(LabServerApp):
    """JupyterLab's front end served by jupyterlab_server at /lab."""

    name = "voyager_lab"
    app_name = "JupyterLab"
    description = "JupyterLab (the @jupyterlab front end on Debian's jupyterlab_server)"
    extension_url = "/lab"
    default_url = "/lab"
    app_url = "/lab"
    load_other_extensions = True
    file_url_prefix = "/lab/tree"

    static_dir = os.path.join(DATA, "static")
    templates_dir = os.path.join(DATA, "templates")
    schemas_dir = os.path.join(DATA, "schemas")
    themes_dir = os.path.join(DATA, "themes")
    app_settings_dir = os.path.join(DATA, "settings")
    user_settings_dir = os.path.join(jupyter_config_dir(), "lab", "user-settings")
    workspaces_dir = os.path.join(jupyter_config_dir(), "lab", "workspaces")
    # The bundle has every extension built in: prebuilt (federated)
    # extensions are not loaded, so none are listed.
    labextensions_path = []

    def _app_version_default(self):
        return _version()

    def initialize_templates(self):
        super().initialize_templates()
        # The bundle at static/voyager_lab/, and MathJax at static/voyager_lab/mathjax/.
        self.static_paths = [self.static_dir, os.path.dirname(MATHJAX)]

    def initialize_handlers(self):
        super().initialize_handlers()
        if int(jupyter_server.__version__.split(".")[0]) < 2:
            self.handlers.append((r"/api/me", IdentityHandler))

    def initialize_settings(self):
        super().initialize_settings()
        settings = self.serverapp.web_app.settings
        # MathJax from Debian's libjs-mathjax, served with the bundle, so
        # that math renders without reaching a CDN.
        if not settings.get("mathjax_url") and os.path.exists(os.path.join(MATHJAX, "MathJax.js")):
            settings["mathjax_url"] = url_path_join("static", self.name, "mathjax", "MathJax.js")
        # Under JupyterHub, what JupyterLab's own LabApp adds for the hub
        # extension (File > Hub Control Panel, Log Out).
        prefix = settings.get("hub_prefix")
        if prefix:
            page = settings.setdefault("page_config_data", {})
            page.setdefault("hubPrefix", prefix)
            page.setdefault("hubHost", settings.get("hub_host", ""))
            page.setdefault("hubUser", settings.get("user", ""))
            page.setdefault("shareUrl", url_path_join(prefix, "user-redirect"))
            page.setdefault("hubServerName", getattr(self.serverapp, "server_name", ""))


def _jupyter_server_extension_points():
    return [{"module": "voyager_lab", "app": VoyagerLab}]


main = launch_new_instance = VoyagerLab.launch_instance

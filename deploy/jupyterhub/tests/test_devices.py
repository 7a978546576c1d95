"""The spawn form's GPU kinds: whole GPUs, MIG devices and fractions of
shared GPUs, each with what is free of it for the user, read on her
behalf from the fake Voyager of test_spawner.py (GET /api/v1/nodes with
?devices=true, as the real API answers it); choosing one sends the request
the API takes, and a refused form comes back as the user left it.
Run: /usr/bin/python3 -m unittest discover -s deploy/jupyterhub/tests
"""

import os
import sys
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jupyterhub.objects import Hub  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.netutil import bind_sockets  # noqa: E402

from test_spawner import FakeVoyager, make_app  # noqa: E402
from voyager_spawner import SpawnError, VoyagerSpawner  # noqa: E402
from voyager_spawner import devices as dev  # noqa: E402

A100, L4, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3"


def gpu(model, index, **kw):
    d = {"uuid": f"GPU-{model[-4:]}-{index}", "index": index, "model": model, "memoryMiB": 81920, "healthy": True}
    d.update(kw)
    return d


def mig(index, profile, mib, **kw):
    return gpu(A100, index, migProfile=profile, memoryMiB=mib, parent="GPU-parent", **kw)


# As GET /api/v1/nodes?devices=true answers ada: her own holdings named,
# another user's "(another user)".
NODES = [
    {"name": "gpu-1", "simulated": True, "models": {A100: 6}, "modelsFree": {A100: 4}, "gpus": {"total": 9, "free": 4},
     "devices": [
         gpu(A100, 0), gpu(A100, 1, owner="(another user)"),
         gpu(A100, 2, healthy=False, problem="XID 79: reset the GPU"),
         mig(3, "1g.10gb", 9984, owner="ada", session="s9"), mig(3, "1g.10gb", 9984), mig(3, "1g.10gb", 9984),
         mig(3, "3g.40gb", 40192),
         # bob's fraction closes this one to ada (one owner per shared GPU).
         gpu(A100, 4, shared=True, fractions=1, freeMiB=61440, owner="(another user)"),
         # ada's own two fractions leave 40 GiB for her.
         gpu(A100, 5, shared=True, fractions=2, freeMiB=40960, owner="ada"),
         gpu(A100, 6, shared=True, freeMiB=81920),
     ]},
    # Cordoned: nothing of it is offered.
    {"name": "gpu-2", "cordon": {"node": "gpu-2"}, "models": {H100: 1}, "gpus": {"total": 1},
     "devices": [gpu(H100, 0, shared=True, freeMiB=81920)]},
    {"name": "gpu-3", "models": {L4: 2}, "modelsFree": {L4: 1}, "gpus": {"total": 2, "free": 1},
     "devices": [gpu(L4, 0, memoryMiB=24576),
                 gpu(L4, 1, memoryMiB=24576, shared=True, fractions=1, freeMiB=14336, owner="(another user)")]},
]


class ChoicesTest(unittest.TestCase):
    def test_each_kind_with_what_is_free_for_the_user(self):
        got = {c["value"]: c["label"] for c in dev.device_choices(NODES, "ada")}
        self.assertEqual(got, {
            f"whole:{A100}": f"Whole {A100} GPUs: 1 of 2 free (simulated)",
            f"whole:{L4}": f"Whole {L4} GPUs: 1 of 1 free",
            f"mig:1g.10gb:{A100}": f"MIG 1g.10gb of {A100} (9.75 GiB): 2 of 3 free (simulated)",
            f"mig:3g.40gb:{A100}": f"MIG 3g.40gb of {A100} (39.25 GiB): 1 of 1 free (simulated)",
            f"shared:{A100}": f"A fraction of a shared {A100} (80 GiB each): 2 of 3 open to you, up to 80 GiB free on one (simulated)",
            f"shared:{L4}": f"A fraction of a shared {L4} (24 GiB each): none of 1 open to you now, your server would wait",
        })
        # In the order the select shows them: whole, MIG, shared.
        self.assertEqual([c["kind"] for c in dev.device_choices(NODES, "ada")], ["whole"] * 2 + ["mig"] * 2 + ["shared"] * 2)

    def test_another_users_fractions_close_a_shared_gpu(self):
        # The same cluster as bob sees it: ada's fractions close GPU 5 to
        # him (the API names her only to herself; the rule is the same).
        bob = [dict(n, devices=[dict(d, owner="(another user)") if d.get("owner") == "ada" else d for d in n["devices"]])
               for n in NODES]
        got = {c["value"]: c["label"] for c in dev.device_choices(bob, "bob")}
        self.assertIn("1 of 3 open to you, up to 80 GiB free on one", got[f"shared:{A100}"])
        # Her MIG device is held, whoever looks.
        self.assertIn("2 of 3 free", got[f"mig:1g.10gb:{A100}"])
        # With the empty GPU taken too, the most free is on none: 0 open.
        full = [dict(n, devices=[dict(d, fractions=1, freeMiB=1024, owner="(another user)") if d.get("shared") else d
                                 for d in n["devices"]]) for n in bob]
        got = {c["value"]: c["label"] for c in dev.device_choices(full, "bob")}
        self.assertIn("none of 3 open to you now", got[f"shared:{A100}"])

    def test_an_older_voyager_gives_whole_counts_only(self):
        old = [{k: v for k, v in n.items() if k != "devices"} for n in NODES]
        got = {c["value"]: c["free"] for c in dev.device_choices(old, "ada")}
        self.assertEqual(got, {f"whole:{A100}": f"{A100}: 4 of 6 GPUs free", f"whole:{L4}": f"{L4}: 1 of 2 GPUs free"})

    def test_model_patterns_match_one_model(self):
        for model in (A100, "GPU [rev 2] *big*?", "back\\slash"):
            pat = dev.model_pattern(model)
            self.assertEqual(dev.pattern_model(pat), model)
        self.assertEqual(dev.model_pattern("A[1]*"), "A\\[1]\\*")
        self.assertIsNone(dev.pattern_model("*A100*"), "a pattern of many models names none")
        with self.assertRaisesRegex(ValueError, "want one of the form's choices"):
            dev.parse_device("gpu:A100")
        with self.assertRaisesRegex(ValueError, "want one of the form's choices"):
            dev.parse_device("mig::A100")


class FormTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.fake = FakeVoyager()
        self.fake.nodes = NODES
        sockets = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(make_app(self.fake))
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    async def asyncTearDown(self):
        self.server.stop()

    def spawner(self, **kw):
        user = SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/")
        args = dict(user=user, hub=Hub(base_url="/hub/"), voyager_url=self.url, voyager_token="svc-token", api_token="hub-token",
                    oauth_client_id="jupyterhub-user-ada", gpus=1, cpu_milli=1000, memory_mib=2048)
        args.update(kw)
        return VoyagerSpawner(**args)

    async def test_form_offers_every_kind_read_on_the_users_behalf(self):
        sp = self.spawner()
        form = await sp._options_form(sp)
        reads = [(p, h) for m, p, h in self.fake.requests if p == "/api/v1/nodes"]
        self.assertEqual(len(reads), 1)
        self.assertEqual(reads[0][1]["X-Voyager-On-Behalf-Of"], "ada")
        self.assertIn('<select class="form-control" name="device" id="voyager-device">'
                      '<option value="" selected>The profile\'s GPUs</option><optgroup label="Whole GPUs">', form)
        for c in dev.device_choices(NODES, "ada"):
            self.assertIn(f'<option value="{c["value"]}">{c["label"]}</option>', form)
            self.assertIn(f'<li>{c["free"]}{" (simulated)" if c["simulated"] else ""}</li>', form)
        self.assertIn('<optgroup label="MIG devices">', form)
        self.assertIn('<optgroup label="Fractions of shared GPUs">', form)
        # gpu-1's inventory is simulated, gpu-3's is not: each line says which.
        self.assertIn("<p>Free now:</p>", form)
        self.assertIn(f"<li>{L4}: 1 of 1 GPU free</li>", form)
        self.assertNotIn(H100, form, "a cordoned node's GPUs are offered")
        self.assertIn('name="gpu_share" id="voyager-gpu-share" value=""', form)
        self.assertIn('name="gpu_compute" id="voyager-gpu-compute" value=""', form)

    async def test_a_shared_gpu_sends_its_fraction(self):
        # On the 4-GPU profile: one fraction of a shared A100, not 4 GPUs.
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": ["a100-quad"], "device": [f"shared:{A100}"],
                                                "gpu_share": ["10"], "gpu_compute": ["30"], "gpus": [""]})
        self.assertEqual(sp.user_options, {"profile": "a100-quad", "gpu_kind": "shared", "gpu_model": A100,
                                           "gpu_share_mib": 10240, "gpu_compute_percent": 30})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0001"]["resources"],
                         {"gpus": 1, "gpuModel": A100, "gpuShareMiB": 10240, "gpuComputePercent": 30,
                          "cpuMilli": 16000, "memoryMiB": 65536})
        # Without a compute percent: none sent (no cap of its own).
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": [""], "device": [f"shared:{A100}"], "gpu_share": ["0.5"]})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"],
                         {"gpus": 1, "gpuModel": A100, "gpuShareMiB": 512, "cpuMilli": 1000, "memoryMiB": 2048})

    async def test_a_mig_profile_sends_mig_devices(self):
        # On the 4-GPU profile: one MIG device of the profile chosen.
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": ["a100-quad"], "device": [f"mig:1g.10gb:{A100}"], "gpus": [""]})
        self.assertEqual(sp.user_options, {"profile": "a100-quad", "gpu_kind": "mig", "mig_profile": "1g.10gb", "gpu_model": A100})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0001"]["resources"],
                         {"gpus": 1, "gpuModel": A100, "migProfile": "1g.10gb", "cpuMilli": 16000, "memoryMiB": 65536})
        # As many as the GPUs field says.
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": [""], "device": [f"mig:3g.40gb:{A100}"], "gpus": ["2"]})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"],
                         {"gpus": 2, "gpuModel": A100, "migProfile": "3g.40gb", "cpuMilli": 1000, "memoryMiB": 2048})

    async def test_whole_gpus_of_a_model_replace_a_profiles_fraction(self):
        plist = [{"display_name": "Share", "slug": "share", "default": True,
                  "voyager_override": {"gpu_share_mib": 20480, "gpu_compute_percent": 25}}]
        sp = self.spawner(profile_list=plist, gpus=0)
        sp.user_options = sp.options_from_form({"profile": ["share"], "device": [f"whole:{L4}"]})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0001"]["resources"], {"gpus": 1, "gpuModel": L4, "cpuMilli": 1000, "memoryMiB": 2048})
        # Nothing chosen: the profile's fraction stands.
        sp = self.spawner(profile_list=plist)
        sp.user_options = sp.options_from_form({"profile": ["share"], "device": [""]})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"]["gpuShareMiB"], 20480)

    async def test_whole_gpus_on_a_voyager_profile_of_another_kind_are_refused(self):
        # Voyager fills a request's blanks from the profile it names, so a
        # request cannot take back the profile's MIG profile: say so.
        self.fake.profiles["mig-small"] = {"name": "mig-small", "resources": {"gpus": 1, "migProfile": "1g.10gb", "cpuMilli": 1000, "memoryMiB": 4096}}
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": ["mig-small"], "device": [f"whole:{L4}"]})
        with self.assertRaises(SpawnError) as cm:
            await sp.start()
        self.assertIn("profile 'mig-small' gives MIG devices: for whole GPUs choose a profile of whole GPUs", str(cm.exception))
        self.assertEqual(self.fake.sessions, {}, "nothing was asked of Voyager")
        # Its own kind of another model, or a fraction, is sent (Voyager
        # drops the profile's MIG profile for a fraction).
        sp.user_options = sp.options_from_form({"profile": ["mig-small"], "device": [f"shared:{A100}"], "gpu_share": ["8"]})
        await sp.start()
        r = self.fake.sessions["s0001"]["resources"]
        self.assertEqual((r["gpuShareMiB"], r["gpuModel"], "migProfile" in r), (8192, A100, False))

    async def test_wrong_choices_say_what_would_do_and_the_form_keeps_them(self):
        sp = self.spawner()
        for form, words in [
                ({"device": [f"shared:{A100}"], "gpu_share": [""]}, f"you chose a fraction of a shared {A100}: want the fraction's memory in GiB"),
                # The memory first, even with a compute percent (which needs it).
                ({"device": [f"shared:{A100}"], "gpu_share": [""], "gpu_compute": ["30"]}, "want the fraction's memory in GiB"),
                ({"device": [f"whole:{A100}"], "gpu_share": ["10"]}, "you chose whole GPUs: choose a shared GPU under GPU kind, or clear the share"),
                ({"device": [f"mig:1g.10gb:{A100}"], "gpu_share": ["10"]}, "you chose MIG devices"),
                ({"device": [f"mig:1g.10gb:{A100}"], "gpus": ["0"]}, "GPUs: 0 with MIG devices chosen"),
                ({"gpu_compute": ["30"]}, "Compute percent: it caps a fraction of a shared GPU"),
                ({"device": [f"shared:{A100}"], "gpu_share": ["10"], "gpu_compute": ["150"]}, "want a whole percent from 1 to 100"),
                ({"device": ["tpu:v5"]}, "GPU kind: 'tpu:v5': want one of the form's choices")]:
            with self.subTest(form=form):
                with self.assertRaises(ValueError) as cm:
                    sp.options_from_form(dict(form, profile=["a100-small"]))
                self.assertIn(words, str(cm.exception))
        # The hub shows the form again under the error: the last one sent
        # comes back as typed, choice and all.
        with self.assertRaises(ValueError):
            sp.options_from_form({"profile": ["a100-small"], "device": [f"shared:{A100}"], "gpu_share": ["10"], "gpu_compute": ["150"]})
        form = await sp._options_form(sp)
        self.assertIn(f'<option value="shared:{A100}" selected>', form)
        self.assertIn('<input type="radio" name="profile" value="a100-small" checked>', form)
        self.assertIn('name="gpu_share" id="voyager-gpu-share" value="10"', form)
        self.assertIn('name="gpu_compute" id="voyager-gpu-compute" value="150"', form)
        # Once: the next visit starts from the request last sent (none).
        form = await sp._options_form(sp)
        self.assertIn('<option value="" selected>', form)

    async def test_user_options_through_the_rest_api_are_checked(self):
        # The REST API's user_options take the same keys, checked alike.
        for opts, words in [({"gpu_kind": "tpu"}, "gpu_kind = 'tpu': want one of whole, mig, shared"),
                            ({"gpu_kind": "mig"}, "want mig_profile too"),
                            ({"gpu_kind": "shared", "gpu_model": A100}, "want gpu_share_mib too"),
                            ({"mig_profile": "1g.10gb", "gpu_share_mib": 1024}, "not both"),
                            ({"gpu_share_mib": 1024, "gpu_compute_percent": 101}, "want a whole percent from 1 to 100")]:
            with self.subTest(opts=opts):
                sp = self.spawner()
                sp.user_options = opts
                with self.assertRaises(SpawnError) as cm:
                    await sp.start()
                self.assertIn(words, str(cm.exception))
        self.assertEqual(self.fake.sessions, {}, "nothing was asked of Voyager")
        # A compute percent of 0 is no cap, as Voyager reads it; a MIG
        # profile alone implies its kind.
        sp = self.spawner()
        sp.user_options = {"gpu_share_mib": 2048, "gpu_compute_percent": 0}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0001"]["resources"], {"gpus": 1, "gpuShareMiB": 2048, "cpuMilli": 1000, "memoryMiB": 2048})
        sp = self.spawner()
        sp.user_options = {"profile": "a100-quad", "mig_profile": "2g.20gb"}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"],
                         {"gpus": 1, "gpuModel": "*A100*", "migProfile": "2g.20gb", "cpuMilli": 16000, "memoryMiB": 65536})

    async def test_a_refused_request_comes_back_with_its_choice(self):
        # Voyager refuses (no shared GPU could ever hold 100 GiB): the
        # hub's form shows the reason over the same choice.
        self.fake.refuse = (422, "Unsatisfiable request", "no node can ever hold a 102400 MiB fraction of a shared GPU")
        sp = self.spawner()
        sp.user_options = sp.options_from_form({"profile": [""], "device": [f"shared:{A100}"], "gpu_share": ["100"], "gpu_compute": ["50"]})
        with self.assertRaises(SpawnError) as cm:
            await sp.start()
        self.assertIn("Voyager refused this server: no node can ever hold a 102400 MiB fraction", str(cm.exception))
        form = await sp._options_form(sp)
        self.assertIn(f'<option value="shared:{A100}" selected>', form)
        self.assertIn('name="gpu_share" id="voyager-gpu-share" value="100"', form)
        self.assertIn('name="gpu_compute" id="voyager-gpu-compute" value="50"', form)
        # A MIG choice, the same way.
        sp.user_options = sp.options_from_form({"profile": [""], "device": [f"mig:3g.40gb:{A100}"]})
        form = await sp._options_form(sp)
        self.assertIn(f'<option value="mig:3g.40gb:{A100}" selected>', form)


if __name__ == "__main__":
    unittest.main()

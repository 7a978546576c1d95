"""Profiles, the spawn form, and the rule that merges them into a request.

Profiles come from the hub's own `profile_list` (KubeSpawner's shape:
display_name, slug, description, default, profile_options with choices,
with `voyager_override` where KubeSpawner has `kubespawner_override`), or,
when that is empty, from Voyager (GET /api/v1/profiles).

The merge rule, field by field (image, gpus, gpu_model, mig_profile,
gpu_share_mib, gpu_compute_percent, cpu_milli, memory_mib, idle_timeout,
max_runtime), later layers winning:

1. the spawner's own traits (image, gpus, cpu_milli, ...);
2. the chosen profile: a Voyager profile's fields that it sets, then a
   profile_list entry's voyager_override, then the override of each chosen
   profile option;
3. what the user typed in the form's override fields (or sent as
   user_options through the REST API). A blank field is not an override.

So a chosen profile keeps its GPUs, CPU and memory unless the user typed
other values, and a profile that names no image runs the spawner's image.

The kind of GPU (gpu_kind: whole GPUs, MIG devices of a profile, or a
fraction of one shared GPU) is the user's when he chose one in the form
(the device select, devices.py lists its choices): it replaces the
profile's kind with everything of the other kinds, so a MIG device chosen
on a 4-GPU profile is one MIG device (or as many as the GPUs field says),
never 4 GPUs with a MIG profile.
"""

import html
import re

# The fields a profile's voyager_override may set, with their types.
OVERRIDE_FIELDS = {
    "voyager_profile": str,
    "image": str,
    "gpus": int,
    "gpu_model": str,
    "mig_profile": str,
    "gpu_share_mib": int,
    "gpu_compute_percent": int,
    "cpu_milli": int,
    "memory_mib": int,
    "idle_timeout": str,
    "max_runtime": str,
    "env": dict,
}

# The fields a user may override from the form or user_options.
USER_FIELDS = {"gpus": int, "gpu_model": str, "gpu_kind": str, "mig_profile": str, "gpu_share_mib": int,
               "gpu_compute_percent": int, "cpu_milli": int, "memory_mib": int}

# The kinds of GPU a user may choose (user_options' gpu_kind).
GPU_KINDS = ("whole", "mig", "shared")

SLUG_RE = re.compile(r"[^a-z0-9-]+")


def slugify(name):
    """KubeSpawner's slugs: lower-case letters, digits and dashes."""
    return SLUG_RE.sub("-", (name or "").lower()).strip("-") or "profile"


def check_override(where, override):
    """Refuses an override with unknown keys or values of the wrong type."""
    if not isinstance(override, dict):
        raise ValueError(f"{where}: voyager_override must be a dict, not {type(override).__name__}")
    for k, v in override.items():
        want = OVERRIDE_FIELDS.get(k)
        if want is None:
            raise ValueError(f"{where}: voyager_override has {k!r}: want one of {', '.join(sorted(OVERRIDE_FIELDS))}")
        if not isinstance(v, want) or (want is int and (isinstance(v, bool) or v < 0)):
            raise ValueError(f"{where}: voyager_override[{k!r}] = {v!r}: want a {'whole number ≥ 0' if want is int else want.__name__}")
    return dict(override)


def normalize_profile_list(entries):
    """Checks a KubeSpawner-shaped profile_list and returns it normalized:
    each entry with slug, display_name, description, default, override and
    options (each with name, display_name and choices). Raises ValueError
    naming the first thing wrong."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"profile_list must be a list of dicts, not {type(entries).__name__}")
    out, slugs = [], set()
    for i, e in enumerate(entries):
        where = f"profile_list[{i}]"
        if not isinstance(e, dict) or not e.get("display_name"):
            raise ValueError(f"{where}: want a dict with at least display_name")
        known = {"display_name", "slug", "description", "default", "voyager_override", "profile_options"}
        extra = set(e) - known
        if extra:
            raise ValueError(f"{where}: unknown keys {sorted(extra)}: want {', '.join(sorted(known))}"
                             + ("; Voyager reads voyager_override where KubeSpawner reads kubespawner_override"
                                if "kubespawner_override" in extra else ""))
        slug = e.get("slug") or slugify(e["display_name"])
        if slug in slugs:
            raise ValueError(f"{where}: slug {slug!r} is used twice")
        slugs.add(slug)
        options = []
        for oname, o in (e.get("profile_options") or {}).items():
            ow = f"{where}.profile_options[{oname!r}]"
            if not isinstance(o, dict) or not isinstance(o.get("choices"), dict) or not o["choices"]:
                raise ValueError(f"{ow}: want a dict with display_name and a non-empty dict of choices")
            choices = []
            for ckey, c in o["choices"].items():
                cw = f"{ow}.choices[{ckey!r}]"
                if not isinstance(c, dict):
                    raise ValueError(f"{cw}: want a dict with display_name and voyager_override")
                choices.append({"key": str(ckey), "display_name": c.get("display_name") or str(ckey),
                                "default": bool(c.get("default")),
                                "override": check_override(cw, c.get("voyager_override") or {})})
            options.append({"name": str(oname), "display_name": o.get("display_name") or str(oname), "choices": choices})
        out.append({"slug": slug, "display_name": e["display_name"], "description": e.get("description", ""),
                    "default": bool(e.get("default")), "override": check_override(where, e.get("voyager_override") or {}),
                    "options": options})
    return out


def from_voyager(items):
    """Voyager's profiles (GET /api/v1/profiles) as normalized profiles.
    Their fields are read again from Voyager at spawn time."""
    out = []
    for p in items:
        name = p.get("name", "")
        if not name:
            continue
        out.append({"slug": name, "display_name": name, "description": p.get("description", ""),
                    "default": False, "override": {"voyager_profile": name}, "options": [],
                    "summary": "; ".join(x for x in (summary(voyager_fields(p)), resources_summary(p)) if x)})
    return out


def resources_summary(p):
    """What a Voyager profile gives its sessions beyond CPU, memory and
    GPUs, in words: "16 GiB /dev/shm, volumes datasets at /data
    (read-only), results at /results". Empty when it sets none."""
    parts = []
    if p.get("shmMiB"):
        parts.append(f"{_num(p['shmMiB'] / 1024)} GiB /dev/shm")
    vols = [f"{v.get('name', '')} at {v.get('mountPath', '')}" + (" (read-only)" if v.get("readOnly") else "")
            for v in p.get("volumes") or []]
    if vols:
        parts.append(("volume " if len(vols) == 1 else "volumes ") + ", ".join(vols))
    return ", ".join(parts)


def voyager_fields(p):
    """The merge fields a Voyager profile sets (its non-zero ones)."""
    r = p.get("resources") or {}
    lim = p.get("limits") or {}
    f = {"image": p.get("image"), "gpus": r.get("gpus"), "gpu_model": r.get("gpuModel"), "mig_profile": r.get("migProfile"),
         "gpu_share_mib": r.get("gpuShareMiB"), "gpu_compute_percent": r.get("gpuComputePercent"),
         "cpu_milli": r.get("cpuMilli"), "memory_mib": r.get("memoryMiB"),
         "idle_timeout": lim.get("idleTimeout"), "max_runtime": lim.get("maxRuntime")}
    return {k: v for k, v in f.items() if v}


def choose(profiles, user_options):
    """The profile user_options names, else the default one (or none for
    Voyager's profiles, whose default is the spawner's own settings), and
    the chosen choice of each of its options. Raises ValueError for a
    profile or choice that does not exist."""
    slug = (user_options or {}).get("profile", "")
    if slug:
        for p in profiles:
            if p["slug"] == slug:
                break
        else:
            raise ValueError(f"no profile {slug!r}: want one of {', '.join(p['slug'] for p in profiles) or '(none defined)'}")
    else:
        p = next((p for p in profiles if p["default"]), None)
        if p is None:
            return None, []
    picked = (user_options or {}).get("profile_options") or {}
    choices = []
    for o in p["options"]:
        key = picked.get(o["name"])
        if key is None:
            c = next((c for c in o["choices"] if c["default"]), o["choices"][0])
        else:
            c = next((c for c in o["choices"] if c["key"] == key), None)
            if c is None:
                raise ValueError(f"profile {p['slug']!r} option {o['name']!r}: no choice {key!r}: want one of "
                                 + ", ".join(c["key"] for c in o["choices"]))
        choices.append(c)
    return p, choices


def user_fields(user_options):
    """The override fields in user_options, checked."""
    out = {}
    for k, want in USER_FIELDS.items():
        if k not in (user_options or {}) or user_options[k] in (None, ""):
            continue
        v = user_options[k]
        if want is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{k} = {v!r}: want a whole number ≥ 0")
        if want is str and not isinstance(v, str):
            raise ValueError(f"{k} = {v!r}: want a string")
        out[k] = v
    if out.get("gpus", 0) > 64:
        raise ValueError(f"gpus = {out['gpus']}: want at most 64")
    kind = out.get("gpu_kind")
    if kind is not None and kind not in GPU_KINDS:
        raise ValueError(f"gpu_kind = {kind!r}: want one of {', '.join(GPU_KINDS)}")
    if "mig_profile" in out and "gpu_share_mib" in out:
        raise ValueError("mig_profile and gpu_share_mib: a MIG device or a fraction of a shared GPU, not both")
    if kind == "whole" and ("mig_profile" in out or "gpu_share_mib" in out):
        raise ValueError("gpu_kind = 'whole' with mig_profile or gpu_share_mib: whole GPUs take neither")
    if kind == "mig" and "mig_profile" not in out:
        raise ValueError("gpu_kind = 'mig': want mig_profile too, such as '1g.10gb'")
    if kind == "shared" and "gpu_share_mib" not in out:
        raise ValueError("gpu_kind = 'shared': want gpu_share_mib too, the fraction's memory in MiB such as 10240")
    if out.get("gpu_compute_percent") == 0:
        del out["gpu_compute_percent"]  # no cap of its own, as Voyager reads 0
    if out.get("gpu_compute_percent", 0) > 100:
        raise ValueError(f"gpu_compute_percent = {out['gpu_compute_percent']}: want a whole percent from 1 to 100, or 0 for no cap")
    return out


def chosen_kind(asked):
    """The kind of GPU the user chose (user_fields' answer), or None to
    keep the profile's: gpu_kind, else the kind his mig_profile or
    gpu_share_mib implies."""
    if asked.get("gpu_kind"):
        return asked["gpu_kind"]
    if "mig_profile" in asked:
        return "mig"
    if "gpu_share_mib" in asked:
        return "shared"
    return None


def apply_kind(fields, asked):
    """Makes the merged fields one kind of GPU when the user chose a kind:
    drops the profile's fields of the other kinds; a MIG choice is one
    device unless the user typed how many. Raises ValueError for a
    compute percent without a fraction."""
    kind = chosen_kind(asked)
    if kind in ("whole", "shared"):
        fields.pop("mig_profile", None)
    if kind in ("whole", "mig"):
        fields.pop("gpu_share_mib", None)
        fields.pop("gpu_compute_percent", None)
    if kind in ("whole", "mig") and asked.get("gpus") == 0:
        raise ValueError(f"gpus = 0 with gpu_kind {kind!r}: want 1 or more, or no gpu_kind for a server without GPUs")
    if kind == "mig" and "gpus" not in asked:
        fields["gpus"] = 1
    if kind == "whole" and not fields.get("gpus"):
        fields["gpus"] = 1
    if fields.get("gpu_compute_percent") and not fields.get("gpu_share_mib"):
        raise ValueError("gpu_compute_percent: a compute percent is of a fraction of a shared GPU: "
                         "choose a shared GPU and the fraction's memory too")
    return fields


def plural(n, one, many=None):
    return f"{n} {one if n == 1 else (many or one + 's')}"


def summary(f):
    """A profile's resources in words: "4 GPUs (*A100*), 8 CPUs, 64 GiB"."""
    parts = []
    if f.get("gpu_share_mib"):
        parts.append(f"{_num(f['gpu_share_mib'] / 1024)} GiB of a shared GPU"
                     + (f" ({f['gpu_compute_percent']}% compute)" if f.get("gpu_compute_percent") else ""))
    elif f.get("mig_profile"):
        parts.append(plural(f.get("gpus") or 1, f"MIG {f['mig_profile']} device")
                     + (f" ({f['gpu_model']})" if f.get("gpu_model") else ""))
    elif "gpus" in f:
        parts.append(plural(f["gpus"], "GPU") + (f" ({f['gpu_model']})" if f.get("gpu_model") else ""))
    if "cpu_milli" in f:
        parts.append(plural(_num(f["cpu_milli"] / 1000), "CPU"))
    if "memory_mib" in f:
        parts.append(f"{_num(f['memory_mib'] / 1024)} GiB")
    return ", ".join(parts)


def _num(x):
    return int(x) if float(x).is_integer() else round(x, 2)


def free_by_model(nodes):
    """What is free now, by GPU model, from GET /api/v1/nodes: [(model,
    free, total)] over the nodes not cordoned, and whether any GPUs are
    simulated. A Voyager older than modelsFree gives no per-model count
    for a node of several models: its free GPUs are listed under all of
    them ("A / B")."""
    per, simulated = {}, False
    for n in nodes:
        if n.get("cordon"):
            continue
        models = n.get("models") or {}
        if not models:
            continue
        simulated = simulated or bool(n.get("simulated"))
        free = n.get("modelsFree")
        if free is None and len(models) > 1:
            key = " / ".join(sorted(models))
            models = {key: sum(models.values())}
            free = {key: (n.get("gpus") or {}).get("free", 0)}
        elif free is None:
            free = {m: (n.get("gpus") or {}).get("free", 0) for m in models}
        for m, total in models.items():
            f, t = per.get(m, (0, 0))
            per[m] = (f + free.get(m, 0), t + total)
    return [(m, f, t) for m, (f, t) in sorted(per.items())], simulated


def form_html(profiles, hub_profiles, defaults_summary, free, error="", previous=None, devices=""):
    """The spawn form: a radio per profile (with its options), override
    fields left blank, the GPU kind select (devices, devices.select_html)
    and what is free now. hub_profiles: the profiles are the hub's
    profile_list, else Voyager's. previous: what the form showed when the
    user sent it, as typed_from_options or form_typed give it (after a
    refusal, the form comes back with the same choices made and the same
    fields filled in, even a field that was wrong)."""
    prev = previous or {}
    prev_slug = prev.get("profile", "")
    slugs = {p["slug"] for p in profiles} | ({""} if not hub_profiles else set())
    use_prev = bool(prev) and prev_slug in slugs
    rows = []
    any_default = any(p["default"] for p in profiles)
    if not hub_profiles:
        # Voyager's profiles: "the hub's defaults" is a choice of its own.
        rows.append(_radio("", "Default server", defaults_summary, prev_slug == "" if use_prev else not any_default, []))
        any_default = True
    for i, p in enumerate(profiles):
        checked = p["slug"] == prev_slug if use_prev else (p["default"] or (not any_default and i == 0))
        chosen = (prev.get("profile_options") or {}) if use_prev and p["slug"] == prev_slug else {}
        rows.append(_radio(p["slug"], p["display_name"], p.get("description") or p.get("summary", ""), checked,
                           p["options"], p.get("summary", "") if p.get("description") else "", chosen))
    err = f'<div class="alert alert-danger">{html.escape(error)}</div>' if error else ""

    def val(k):
        return html.escape(str(prev.get(k) or ""))

    return (
        err +
        '<fieldset class="voyager-profiles"><legend>Server</legend>' + "".join(rows) + "</fieldset>"
        '<fieldset class="voyager-overrides"><legend>Change the profile\'s resources (leave blank to keep them)</legend>'
        + devices +
        '<label for="voyager-gpus">GPUs (or MIG devices)</label>'
        f'<input class="form-control" type="number" min="0" max="64" name="gpus" id="voyager-gpus" value="{val("gpus")}" placeholder="profile\'s">'
        '<label for="voyager-gpu-share">A fraction of one shared GPU: GiB of its memory</label>'
        f'<input class="form-control" type="number" min="0.25" step="0.25" name="gpu_share" id="voyager-gpu-share" value="{val("gpu_share")}" placeholder="none">'
        '<label for="voyager-gpu-compute">The fraction\'s share of the GPU\'s compute, in percent (optional)</label>'
        f'<input class="form-control" type="number" min="1" max="100" step="1" name="gpu_compute" id="voyager-gpu-compute" value="{val("gpu_compute")}" placeholder="no cap">'
        '<label for="voyager-cpu">CPU cores</label>'
        f'<input class="form-control" type="number" min="0.1" step="0.1" name="cpu" id="voyager-cpu" value="{val("cpu")}" placeholder="profile\'s">'
        '<label for="voyager-memory">Memory (GiB)</label>'
        f'<input class="form-control" type="number" min="0.25" step="0.25" name="memory" id="voyager-memory" value="{val("memory")}" placeholder="profile\'s">'
        "</fieldset>" + free
    )


def typed_from_options(user_options):
    """The form's fields as they show user_options (the form's own
    units: cores, GiB), for form_html's previous; {} for none."""
    uo = user_options or {}
    if not uo:
        return {}
    from .devices import device_value
    out = {"profile": uo.get("profile", ""), "profile_options": uo.get("profile_options") or {},
           "gpus": str(uo["gpus"]) if isinstance(uo.get("gpus"), int) and not isinstance(uo.get("gpus"), bool) else "",
           "gpu_share": _number(uo.get("gpu_share_mib"), 1024),
           "gpu_compute": str(uo["gpu_compute_percent"]) if isinstance(uo.get("gpu_compute_percent"), int) else "",
           "cpu": _number(uo.get("cpu_milli"), 1000), "memory": _number(uo.get("memory_mib"), 1024),
           "device": device_value(uo)}
    return out


def form_typed(formdata):
    """The form's fields as the user sent them, for form_html's previous
    when they are refused."""
    def first(k):
        return ((formdata.get(k) or [""])[0] or "").strip()

    slug = first("profile")
    prefix = f"profile-option-{slug}--"
    out = {k: first(k) for k in ("gpus", "gpu_share", "gpu_compute", "cpu", "memory", "device")}
    out["profile"] = slug
    out["profile_options"] = {k[len(prefix):]: first(k) for k in formdata if k.startswith(prefix)}
    return out


def _number(v, per):
    """A user_options amount (milli-cores, MiB) as the form's field shows it
    (cores, GiB), "" when not given."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return ""
    return f"{v / per:g}"


def _radio(slug, name, description, checked, options, extra="", chosen=None):
    s = html.escape(slug)
    chosen = chosen or {}
    opts = ""
    for o in options:
        pick = chosen.get(o["name"])
        if pick not in {c["key"] for c in o["choices"]}:
            pick = None
        sel = "".join(f'<option value="{html.escape(c["key"])}"'
                      f'{" selected" if (c["key"] == pick if pick is not None else c["default"]) else ""}>'
                      f'{html.escape(c["display_name"])}</option>' for c in o["choices"])
        oid = f"profile-option-{s}--{html.escape(o['name'])}"
        opts += (f'<label for="{oid}">{html.escape(o["display_name"])}</label>'
                 f'<select class="form-control" name="{oid}" id="{oid}">{sel}</select>')
    desc = html.escape(description or "")
    if extra:
        desc += f" <small>({html.escape(extra)})</small>"
    return (f'<div class="radio voyager-profile"><label><input type="radio" name="profile" value="{s}"'
            f'{" checked" if checked else ""}> <strong>{html.escape(name)}</strong> {desc}</label>{opts}</div>')


def options_from_form(formdata):
    """user_options from the spawn form: the profile, its options' choices,
    the GPU kind chosen, and only the override fields the user filled in.
    Raises ValueError naming the field that is wrong and what would do."""
    from .devices import parse_device

    def first(k):
        return ((formdata.get(k) or [""])[0] or "").strip()

    opts = {}
    slug = first("profile")
    if slug:
        opts["profile"] = slug
        prefix = f"profile-option-{slug}--"
        chosen = {k[len(prefix):]: first(k) for k in formdata if k.startswith(prefix)}
        if chosen:
            opts["profile_options"] = chosen
    gpus = first("gpus")
    if gpus:
        if not gpus.isdigit() or int(gpus) > 64:
            raise ValueError(f"GPUs: {gpus!r}: want a whole number from 0 to 64, or blank for the profile's")
        opts["gpus"] = int(gpus)
    # Form field → (user_options key, units per unit typed, least, label, example).
    for field, key, scale, least, label, example in (
            ("gpu_share", "gpu_share_mib", 1024, 256, "GPU share", "GiB of a shared GPU such as 10"),
            ("cpu", "cpu_milli", 1000, 100, "CPU cores", "a number of cores such as 0.5 or 4"),
            ("memory", "memory_mib", 1024, 256, "Memory", "GiB such as 0.5 or 16")):
        typed = first(field)
        if not typed:
            continue
        try:
            value = round(float(typed) * scale)
        except ValueError:
            value = 0
        if value < least:
            raise ValueError(f"{label}: {typed!r}: want {example}, or blank for the profile's")
        opts[key] = value
    device = parse_device(first("device"))
    kind = device.get("gpu_kind")
    if kind == "shared" and "gpu_share_mib" not in opts:
        raise ValueError(f"GPU share: you chose a fraction of a shared {first('device')[len('shared:'):]}: "
                         "want the fraction's memory in GiB such as 10")
    if kind in ("whole", "mig") and "gpu_share_mib" in opts:
        words = "whole GPUs" if kind == "whole" else "MIG devices"
        raise ValueError(f"GPU share: a fraction is of a shared GPU, and you chose {words}: "
                         "choose a shared GPU under GPU kind, or clear the share")
    if kind in ("whole", "mig") and opts.get("gpus") == 0:
        words = "whole GPUs of a model" if kind == "whole" else "MIG devices"
        raise ValueError(f"GPUs: 0 with {words} chosen: want 1 or more (or blank for one), or choose "
                         "the profile's GPUs under GPU kind")
    compute = first("gpu_compute")
    if compute:
        if not compute.isdigit() or not 1 <= int(compute) <= 100:
            raise ValueError(f"Compute percent: {compute!r}: want a whole percent from 1 to 100, or blank for no cap")
        if "gpu_share_mib" not in opts:
            raise ValueError("Compute percent: it caps a fraction of a shared GPU: choose a shared GPU under "
                             "GPU kind and type the fraction's memory, or leave the percent blank")
        opts["gpu_compute_percent"] = int(compute)
    opts.update(device)
    return opts

"""The spawn form's GPU choices and what is free of each.

Voyager's nodes offer three kinds of GPU device: whole GPUs, the MIG
devices of a GPU an operator partitioned, and shared GPUs that hold
fractions of their memory (gpuShareMiB, enforced by CUDA MPS on the node).
The form offers each as a choice of its GPU kind select, by model (and MIG
profile), with what is free of it for the user now. It reads them from
GET /api/v1/nodes?devices=true, asked on the user's behalf, so another
user's fraction on a shared GPU closes that GPU to her (a shared GPU holds
one owner's fractions at a time), as Voyager's web console shows them
(console/devices.go). Cordoned nodes are left out; a simulated inventory
is labelled so.

The select's values name what the form asks Voyager for:
"whole:<model>", "mig:<profile>:<model>", "shared:<model>" (a MIG profile
has no colon, a model may). A Voyager without per-device listings (older
than ?devices=true) gives the whole-GPU counts of modelsFree only.
"""

import html

from . import profiles as prof

KIND_WORDS = {"whole": "Whole GPUs", "mig": "MIG devices", "shared": "Fractions of shared GPUs"}


def model_pattern(model):
    """A model name as Voyager's gpuModel pattern (path.Match) that matches
    that name alone: its metacharacters escaped."""
    out = []
    for ch in model:
        if ch in "*?[\\":
            out.append("\\")
        out.append(ch)
    return "".join(out)


def pattern_model(pattern):
    """The model name a model_pattern names, or None for a pattern with
    unescaped metacharacters (it matches more than one name)."""
    out, esc = [], False
    for ch in pattern or "":
        if esc:
            out.append(ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch in "*?[":
            return None
        else:
            out.append(ch)
    return "".join(out) if not esc else None


def _gib(mib):
    return f"{prof._num(round(mib / 1024, 2))} GiB"


def device_choices(nodes, user):
    """The form's GPU choices from GET /api/v1/nodes(?devices=true): a list
    of dicts (value, kind, model, profile, label, simulated), whole GPUs
    first, then MIG devices, then shared GPUs, each by model. Counts are
    of the healthy devices of the nodes not cordoned: whole GPUs and MIG
    devices free (no holder); shared GPUs open to user (no fraction held,
    or only hers) and the most memory free on one of them."""
    whole, migs, shares = {}, {}, {}
    listed = any("devices" in n for n in nodes)
    for n in nodes:
        if n.get("cordon"):
            continue
        for d in n.get("devices") or []:
            model, sim = d.get("model", ""), bool(n.get("simulated") or d.get("simulated"))
            healthy, owner = bool(d.get("healthy")), d.get("owner", "")
            if d.get("migProfile"):
                m = migs.setdefault((model, d["migProfile"]), {"free": 0, "all": 0, "mib": d.get("memoryMiB", 0), "sim": False})
                m["all"] += 1
                m["free"] += healthy and not owner
                m["sim"] = m["sim"] or sim
            elif d.get("shared"):
                s = shares.setdefault(model, {"open": 0, "all": 0, "most": 0, "mib": 0, "sim": False})
                s["all"] += 1
                s["sim"] = s["sim"] or sim
                s["mib"] = max(s["mib"], d.get("memoryMiB", 0))
                free = d.get("freeMiB", 0) if d.get("fractions") else d.get("memoryMiB", 0)
                if healthy and owner in ("", user) and free > 0:
                    s["open"] += 1
                    s["most"] = max(s["most"], free)
            else:
                w = whole.setdefault(model, {"free": 0, "all": 0, "sim": False})
                w["sim"] = w["sim"] or sim
                if healthy:
                    w["all"] += 1
                    w["free"] += not owner
    out = []
    if not listed:
        # An older Voyager: modelsFree's counts, whole GPUs and MIG devices together.
        per, simulated = prof.free_by_model(nodes)
        for model, free, total in per:
            whole[model] = {"free": free, "all": total, "sim": simulated}
    for model, w in sorted(whole.items()):
        out.append(_choice("whole", model, "", f"{model}: {w['free']} of {prof.plural(w['all'], 'GPU')} free",
                           f"Whole {model} GPUs: {w['free']} of {w['all']} free", w["sim"]))
    for (model, profile), m in sorted(migs.items()):
        words = f"MIG {profile} of {model} ({_gib(m['mib'])}): {m['free']} of {m['all']} free"
        out.append(_choice("mig", model, profile, words, words, m["sim"]))
    for model, s in sorted(shares.items()):
        if s["open"]:
            words = (f"A fraction of a shared {model} ({_gib(s['mib'])} each): {s['open']} of {s['all']} open to you, "
                     f"up to {_gib(s['most'])} free on one")
        else:
            words = (f"A fraction of a shared {model} ({_gib(s['mib'])} each): none of {s['all']} open to you now, "
                     "your server would wait")
        out.append(_choice("shared", model, "", words, words, s["sim"]))
    return out


def _choice(kind, model, profile, free_words, label, sim):
    value = {"whole": f"whole:{model}", "mig": f"mig:{profile}:{model}", "shared": f"shared:{model}"}[kind]
    return {"value": value, "kind": kind, "model": model, "profile": profile, "simulated": sim,
            "free": free_words, "label": label + (" (simulated)" if sim and "(simulated)" not in label else "")}


def device_value(user_options):
    """The select value that user_options chose ("" for none), so a form
    shown again after a refusal keeps the choice."""
    uo = user_options or {}
    kind = prof.chosen_kind({k: v for k, v in uo.items() if v not in (None, "")})
    model = pattern_model(uo.get("gpu_model") or "")
    if kind == "mig" and model and uo.get("mig_profile"):
        return f"mig:{uo['mig_profile']}:{model}"
    if kind == "shared" and model:
        return f"shared:{model}"
    if kind == "whole" and model:
        return f"whole:{model}"
    return ""


def parse_device(value):
    """user_options for a select value: gpu_kind, gpu_model and, for a MIG
    device, mig_profile. Raises ValueError for a value the form never
    offers."""
    kind, _, rest = (value or "").partition(":")
    if not value:
        return {}
    if kind == "mig":
        profile, _, model = rest.partition(":")
        if profile and model:
            return {"gpu_kind": "mig", "mig_profile": profile, "gpu_model": model_pattern(model)}
    elif kind in ("whole", "shared") and rest:
        return {"gpu_kind": kind, "gpu_model": model_pattern(rest)}
    raise ValueError(f"GPU kind: {value!r}: want one of the form's choices: whole:<model>, "
                     "mig:<profile>:<model> or shared:<model>, or none for the profile's GPUs")


def free_html(choices):
    """The form's "free now" block: one line per choice, those of a
    simulated inventory marked so (all at once when all are)."""
    if not choices:
        return "<p>Free now: no GPUs registered.</p>"
    every = all(c["simulated"] for c in choices)
    note = " (simulated GPUs)" if every else ""

    def words(c):
        mark = c["simulated"] and not every and "(simulated)" not in c["free"]
        return c["free"] + (" (simulated)" if mark else "")

    items = "".join(f"<li>{html.escape(words(c))}</li>" for c in choices)
    return f'<p>Free now{note}:</p><ul class="voyager-free">{items}</ul>'


def select_html(choices, selected=""):
    """The GPU kind select: the profile's GPUs, then each choice grouped by
    kind. A selected value no longer offered (the last shared GPU of a
    model gone) is kept as a choice of its own, so the form shows it."""
    opts = [f'<option value=""{" selected" if not selected else ""}>The profile\'s GPUs</option>']
    values = {c["value"] for c in choices}
    for kind in ("whole", "mig", "shared"):
        group = [c for c in choices if c["kind"] == kind]
        if not group:
            continue
        opts.append(f'<optgroup label="{KIND_WORDS[kind]}">')
        for c in group:
            sel = " selected" if c["value"] == selected else ""
            opts.append(f'<option value="{html.escape(c["value"])}"{sel}>{html.escape(c["label"])}</option>')
        opts.append("</optgroup>")
    if selected and selected not in values:
        opts.append(f'<option value="{html.escape(selected)}" selected>{html.escape(selected)} (not offered now)</option>')
    return ('<label for="voyager-device">GPU kind</label>'
            '<select class="form-control" name="device" id="voyager-device">' + "".join(opts) + "</select>")

# Helpers shared by the rules: the config, names of every output, and per-rule settings.
# No evaluation logic lives here; every rule's `shell:` calls one `fideval` verb.
import re
import sys


# Every rule runs the `fideval` CLI; with --software-deployment-method apptainer it runs inside this image,
# built from workflow/Containerfile (see README, "Clusters").
container: "docker://ghcr.io/fideval/fideval:0.1.0"


from fideval.errors import FidevalError
from fideval.formats.ids import sequence_ids
from fideval.run_config import resolve
from fideval.score.fused import fusable
from fideval.model.teacher_pass import store_kind

# The stages read the config file themselves; the workflow takes its names and sizes from the same typed
# model (defaults included), so the two can never disagree. The file is the last --configfile (else
# configs/demo.yaml); --config overrides are merged into results/<run>/config.yaml, which the stages read.
# A config problem is one line (the JSON schema: `fideval schema`).
try:
    CONFIG_FILE, CFG = resolve(
        workflow.config_settings.configfiles,
        workflow.config_settings.config,
        workflow.configfiles,
        workflow.config_settings.config_args,
    )
except FidevalError as e:
    sys.exit(f"fideval: error: {e.line()}")
RUN = CFG.run
W = CFG.windows.window_tokens
C = CFG.windows.cut_tokens
WPD = CFG.windows.windows_per_domain
DOMAINS = [d.name for d in CFG.domains]
KINDS = list(CFG.teacher.lengths)
# a candidate's routing (docs/formats-routes.md): `record` has the teacher and its runs record their routes;
# `decompose` also runs each path with the teacher's routes forced (path "<path>+teacher-routes", its own records)
TEACHER_ROUTES = any(c.routing != "off" for c in CFG.candidates)
CANDIDATES = {
    c.name: list(c.paths)
    + ([f"{p}+teacher-routes" for p in c.paths] if c.routing == "decompose" else [])
    for c in CFG.candidates
}
MP = CFG.teacher.model_parallel
HEADLINE = CFG.candidates[0].name if CFG.candidates else "none"
# several builds scored on one path: `fideval compare` ranks them (size vs mean KLD, the frontier, simultaneous
# intervals) at the windows' length on the first path they all share, and the card gets that section (issue 43)
SHARED_PATHS = [
    p
    for p in (CFG.candidates[0].paths if CFG.candidates else [])
    if all(p in c.paths for c in CFG.candidates)
]
FAMILY = (
    (SHARED_PATHS[0], W if "windows" in KINDS else C)
    if len(CFG.candidates) >= 2 and SHARED_PATHS
    else None
)
# teacher.fused: one `fideval fused` job per (length, domain) writes the store, every emulated candidate's records
# and the self-check (workflow/rules/teacher.smk); real builds keep their own `score` jobs
FUSED = bool(CFG.teacher.fused)
# teacher.store (auto: hidden, logits with the reference code): a hidden store's head file is one of its outputs
STORE = store_kind(CFG.teacher.store, CFG.model.implementation)
FUSED_PAIRS = [(c.name, p) for c, p in fusable(CFG)] if FUSED else []
SEPARATE = sorted({c.name for c in CFG.candidates} - {c for c, _ in FUSED_PAIRS})
SEPARATE_RE = (
    "|".join(re.escape(n) for n in SEPARATE) or r"(?!x)x"
)  # the `score` rule's candidates
NOISE_MICRO_BATCH = CFG.report.noise_floor.micro_batch if CFG.report.noise_floor else 0


# Before the first job runs (snakemake skips onstart on dry runs and when nothing is to be done), refuse in
# seconds a config some stage would refuse hours in: README.md, "What validate checks".
onstart:
    shell("fideval validate {CONFIG_FILE:q}")


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    kind="windows|cuts",
    domain=r"[a-z0-9][a-z0-9_-]*",
    candidate=r"[a-z0-9][a-z0-9_.-]*",
    path=r"(serving|weights-only|llamacpp)(\+teacher-routes)?",


def windows_dir(run):
    return f"results/{run}/windows"


def seq_ids(kind, domain):
    """The sequence ids of one domain's windows or cuts (the grammar is fideval/formats/ids.py)."""
    return sequence_ids(domain, WPD, None if kind == "windows" else W // C)


def shard_outputs(kind, domain="{domain}", run="{run}", root="teacher"):
    """Every shard of one (kind, domain) store, named as outputs so that deleting one reruns its job.

    By default returned with {run} and {domain} left as wildcards: a domain's sequence ids are known from the config.
    """
    head = (
        [f"results/{run}/{root}/{kind}/{domain}/head.safetensors"]
        if STORE == "hidden"
        else []
    )
    routes = (
        [f"results/{run}/{root}/{kind}/{domain}/routes/routes.json"]
        if TEACHER_ROUTES and root == "teacher"
        else []
    )
    return (
        [
            f"results/{run}/{root}/{kind}/{domain}/shards/{i}.safetensors"
            for i in seq_ids(kind, domain)
        ]
        + head  # a hidden store's lm head (docs/formats-store.md) is part of it
        + routes  # and the teacher's routes index when a candidate's routing asks for it
    )


# One job per (rule, length[, candidate, path]) runs every domain, one after another in one process: the verb
# takes each domain as --domain and writes each domain's own store or records folder (`{domain}` in --out), so the
# imports and the scheduler's round trip are paid once a length, not once a domain (issue 45).
DOMAIN_ARGS = " ".join(f"--domain {d}" for d in DOMAINS)


def store_inputs(run, kind, root="teacher"):
    """Every domain's manifest and shards of one length's stores (a grouped job's inputs)."""
    return [f"results/{run}/{root}/{kind}/{d}/manifest.json" for d in DOMAINS] + [
        f for d in DOMAINS for f in shard_outputs(kind, d, run, root)
    ]


def per_domain(template):
    """``template`` (with {run}, {kind}, ... left as wildcards) for every domain: a grouped job's outputs."""
    return [template.replace("{domain}", d) for d in DOMAINS]


def device(wildcards, resources):
    """A rule's --device follows its gpu resource (set per platform in workflow/profiles/)."""
    return "cuda" if int(getattr(resources, "gpu", 0) or 0) > 0 else "cpu"


def launcher():
    """`fideval`, or torchrun over model_parallel ranks for the stages that run the model."""
    if MP > 1:
        return f"torchrun --standalone --nproc-per-node {MP} -m fideval"
    return "fideval"


def records_dirs(run):
    out = []
    for cand, paths in CANDIDATES.items():
        for path in paths:
            for kind in KINDS:
                for domain in DOMAINS:
                    out.append(f"results/{run}/records/{cand}/{path}/{kind}/{domain}")
    return out


def selfcheck_dirs(run):
    return [
        f"results/{run}/records/teacher-self/store/{kind}/{domain}"
        for kind in KINDS
        for domain in DOMAINS
    ]


def noise_dirs(run):
    """Records of the noise floor (config report.noise_floor), one per length and domain; [] when not asked for."""
    if CFG.report.noise_floor is None:
        return []
    return [
        f"results/{run}/records/noise-floor/store/{kind}/{domain}"
        for kind in KINDS
        for domain in DOMAINS
    ]


def teacher_manifests(run):
    return [
        f"results/{run}/teacher/{kind}/{domain}/manifest.json"
        for kind in KINDS
        for domain in DOMAINS
    ]


def final_outputs():
    """The report, card and gate, and every intermediate product the run keeps (windows, stores, records).

    Snakemake >= 7.7 ignores a deleted intermediate file when the files made from it are up to date
    (snakemake/snakemake#1978), so a deleted teacher shard would never be rebuilt. Naming every kept product
    as a target makes a deleted shard rerun its own job and exactly the jobs downstream of it.
    """
    kept = [
        f"results/{RUN}/windows/eval-windows.json",
        f"results/{RUN}/windows/index.parquet",
        f"results/{RUN}/windows/windows-{W}/tokens.safetensors",
        f"results/{RUN}/windows/cuts-{C}/tokens.safetensors",
    ]
    for kind in KINDS:
        for domain in DOMAINS:
            kept += [f.format(run=RUN, domain=domain) for f in shard_outputs(kind)]
    kept += teacher_manifests(RUN)
    for d in records_dirs(RUN) + selfcheck_dirs(RUN) + noise_dirs(RUN):
        kept += [f"{d}/records.parquet", f"{d}/score.json"]
    family = [f"reports/{RUN}/family/comparison.json"] if FAMILY else []
    return (
        kept
        + family
        + [
            f"reports/{RUN}/report.json",
            f"reports/{RUN}/plots",
            f"reports/{RUN}/README.md",
            f"reports/{RUN}/results.html",
            f"reports/{RUN}/check.txt",
        ]
    )

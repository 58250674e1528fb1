# Shared wiring: the resolved workflow spec (the config validated before any job runs), wildcard
# constraints and the file names every stage shares. Decisions (roles, evaluation groups, seed
# keys, consistency checks, the specs each command receives) live in floorgap.config, where
# unit tests reach them; rules only name files, resources and the command. Specs travel as
# `params`, so a rule reruns exactly when the part of the config it reads changes.
import os
import re
import sys

try:
    from floorgap.config import ConfigError, as_json, resolve
    from floorgap.reports.registry import report_items
except ImportError as exc:
    raise ImportError(
        f"the floorgap package is not importable by the Python running Snakemake ({sys.executable}): "
        "run `bash envs/install.sh` and start the workflow with `.venv/bin/snakemake`"
    ) from exc

try:
    # validated against the schema (defaults filled; each target's merged settings too)
    W = resolve(config)
except ConfigError as exc:
    raise ValueError(f"inconsistent config: {exc}") from None

# Rules call the console command `floorgap`: put the interpreter running Snakemake (for instance
# .venv/bin of `.venv/bin/snakemake`) first on PATH, so the jobs find it without an activated
# environment. `--sdm conda` jobs activate their env in front of it.
envvars:
    "PATH",


JOB_PATH = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
os.environ["PATH"] = JOB_PATH

LOGS = "results/logs"
CONDA_ENV = "../../envs/floorgap.yaml"
# glibc's malloc keeps freed blocks up to 32 MiB in its heap (and 4 GiB of free heap) instead of
# mapping them afresh: a decode step frees and reallocates the same activations, and each fresh
# mapping is faulted in and zeroed again (the training-data pass ran ~12% faster with it, SmolLM2
# bf16 on 2 cores). A GLIBC_TUNABLES the user set wins. Prefix of a decoding rule's command.
REUSE_FREED_MEMORY = ("GLIBC_TUNABLES=${{GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=33554432"
                      ":glibc.malloc.trim_threshold=4294967296}} ")


wildcard_constraints:
    target="|".join(map(str, W.targets)) or "NONE",
    domain="|".join(W.domains) or "NONE",
    shard=r"\d+",
    variant="|".join(map(str, W.drafter_names)) or "NONE",
    summary="|".join(W.eval_groups),
    # the configured systems and the folders the checks serve
    system="|".join([*W.serving["systems"], *W.check_systems]) or "NONE",


def model_dir(target):
    return f"results/models/{target}"


def per_domain(pattern):
    """An input function: ``pattern`` (with {target} and {domain}) for every domain."""
    return lambda w: [pattern.format(target=w.target, domain=d) for d in W.domains]


def per_shard(pattern):
    """An input function: ``pattern`` (with {target}, {domain}, {shard}) for every domain and
    shard of the rollouts."""
    return lambda w: [
        pattern.format(target=w.target, domain=d, shard=s) for d in W.domains for s in W.shards()
    ]


def weights_file(target, evaluation):
    """final.pt, or epochs/epoch-<e>.pt of an earlier epoch of the training trajectory."""
    folder = f"results/{target}/drafters/{evaluation.variant}"
    if evaluation.weights == "final":
        return f"{folder}/final.pt"
    return f"{folder}/epochs/{evaluation.weights}.pt"


def eval_record(target, evaluation, kind, domain="{domain}", shard="{shard}"):
    """A drafter_eval record file (target, domain and shard may stay wildcards)."""
    return (
        f"results/{target}/drafter_eval/{evaluation.job}/{evaluation.variant}/"
        f"{evaluation.weights}/{domain}/{kind}-{shard}.parquet"
    )


# Input functions of the stages' rules (here, so that each rule file holds rules only).


# the drafters (drafters.smk)
def training_data(w):
    """The training record, for a drafter that is trained."""
    return [] if W.is_imported(w.variant, w.target) else f"results/{w.target}/drafter_data/blocks.pt"


def checkpoint_files(w):
    """config.json and the safetensors files of an imported drafter's local folder."""
    entry = W.variant_entry(w.variant, w.target).get("checkpoint") or {}
    if "path" not in entry:
        return []  # trained, or fetched from the hub by the job
    folder = Path(entry["path"]).expanduser()
    return [str(folder / "config.json"), *sorted(str(p) for p in folder.glob("*.safetensors*"))]


# the gap summaries (gaps.smk)
def gaps_records(kind):
    """Every drafter_eval shard a summary reads, for one record kind ("paths" or "slots")."""
    return lambda w: [
        eval_record(w.target, e, kind, domain, shard)
        for e in W.summary_evaluations(w.summary, w.target)
        for domain in W.domains
        for shard in W.shards()
    ]


# serving (serving.smk)
def served_drafter(w):
    """The folder the engine loads for a drafter system: a variant's export, or a checked
    folder as it is (none for `ar` and `target`)."""
    folder = W.served_folder(w.target, w.system)
    return [] if folder is None else folder


# the manifest (manifest.smk)
def target_records(target):
    """Every record file of one target that the manifest covers."""
    per_domain_files = [
        f"results/{target}/{kind}/{domain}.parquet"
        for kind in ("corpus", "anchors")
        for domain in W.domains
    ]
    rollouts = [
        f"results/{target}/rollouts/{domain}/{kind}-{shard}.parquet"
        for domain in W.domains
        for shard in W.shards()
        for kind in ("paths", "floors")
    ]
    # the MI probe runs on full targets only (a cross_target target runs what Fig. 5 reads)
    mi = ([f"results/{target}/mi/{domain}.parquet" for domain in W.domains]
          if W.scope(target) == "full" else [])
    floors = [f"results/{target}/floors/{name}.parquet" for name in ("anchor_slot", "summary")]
    gaps = [f"results/{target}/gaps/{name}.parquet" for name in W.summaries(target)]
    return per_domain_files + rollouts + mi + floors + gaps

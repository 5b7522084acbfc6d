"""``fideval verify``, ``import-llamacpp``, ``export-llamacpp`` and ``fideval store materialize`` / ``card``: check a
store; turn a llama.cpp KLD base into one, and one into a llama.cpp KLD base; write a hidden store's logits as a logit
store; (re)write a store's dataset card; ``fideval store import-hidden-suite``: a hidden-state fidelity suite's
reference as a hidden store."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def verify(store: Annotated[str, typer.Argument(help="store folder or hf://datasets/ORG/NAME@REV/sub")]) -> None:
    """Check every shard of a store (hash, size, header, rows, manifest, index; a hidden store's head); one line per problem."""
    from fideval.store.hub import resolve_store
    from fideval.store.verify import verify_store

    root = resolve_store(store)
    problems, totals = verify_store(root)
    for line in problems:
        typer.echo(f"{store}: {line}", err=True)
    if problems:
        typer.echo(f"{store}: {len(problems)} problem(s) (re-run the teacher for the shards named above, "
                   "or re-download the store)", err=True)
        raise typer.Exit(1)
    typer.echo(f"{store}: ok ({totals['shards']} shards, {totals['rows']:,} rows, {totals['bytes'] / 1e9:.3f} GB)")


def import_llamacpp_cmd(
    file: Annotated[Path, typer.Argument(help="file written by llama-perplexity --kl-divergence-base")],
    out: Annotated[Path, options.out("store folder to write")],
    model_id: Annotated[str, typer.Option("--model-id", help="the base model that produced the file")] = "unknown",
    model_revision: Annotated[str, typer.Option("--model-revision")] = "unknown",
    tokenizer_sha256: Annotated[str, typer.Option("--tokenizer-sha256")] = "unknown",
    domain: Annotated[str, typer.Option("--domain", help="domain and sequence id prefix")] = "llamacpp",
    bos_id: Annotated[int | None, typer.Option(
        "--bos-id", help="write this id at position 0 of each chunk, as llama.cpp evaluated it")] = None,
) -> None:
    """Import a llama.cpp --kl-divergence-base file as a lossy teacher store of kind 'logprobs'."""
    from fideval.errors import FidevalError
    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.store.llamacpp import LOSSY, KldBase, import_llamacpp

    KldBase(file)  # a bad file is refused before anything is created at --out
    if out.exists() and not out.is_dir():
        raise FidevalError(f"--out {out} exists and is not a folder", hint="choose a folder")
    typer.echo(f"fideval: warning: {file} is lossy: {LOSSY}", err=True)
    with output_lock(out, "import-llamacpp"):  # one writer per store folder
        remove_temps(out)
        s = import_llamacpp(file, out, model_id=model_id, model_revision=model_revision,
                            tokenizer_sha256=tokenizer_sha256, domain=domain, bos_id=bos_id)
    typer.echo(f"{out}: {s['shards']} shards ({s['written']} written) from {s['chunks']} chunks of {s['n_ctx']} tokens, "
               f"{s['rows_per_chunk']} rows each, vocab {s['n_vocab']}")


def export_llamacpp_cmd(
    store: Annotated[str, typer.Argument(help="teacher store folder or hf://datasets/ORG/NAME@REV/sub")],
    out: Annotated[Path, typer.Argument(help="the --kl-divergence-base file to write (e.g. teacher.kld)")],
    n_ctx: Annotated[int | None, typer.Option(
        "--n-ctx", help="export only the sequences of this length (default: the store's one length)")] = None,
) -> None:
    """Write a teacher store as a llama.cpp --kl-divergence-base file (llama-perplexity -c N, N the sequences' length)."""
    from fideval.errors import FidevalError
    from fideval.store.llamacpp_export import export_llamacpp

    if out.is_dir():
        raise FidevalError(f"{out} is a folder", hint="give the file to write, e.g. teacher.kld")
    s = export_llamacpp(store, out, n_ctx=n_ctx)
    if s["lossy"]:
        typer.echo(f"fideval: warning: {store} is itself lossy ({s['lossy']}); its rows were re-encoded", err=True)
    skipped = f"; {s['skipped']} sequences of other lengths skipped" if s["skipped"] else ""
    typer.echo(f"{out}: {s['chunks']} chunks of {s['n_ctx']} tokens ({s['first']} .. {s['last']}, sorted), "
               f"{s['rows_per_chunk']} rows each (positions {s['n_ctx'] // 2}..{s['n_ctx'] - 2}), vocab {s['n_vocab']}"
               f"{skipped}; score a GGUF with: llama-perplexity -m MODEL.gguf --kl-divergence-base {out} "
               f"--kl-divergence -c {s['n_ctx']}")


HELP = ("Teacher stores: materialize a hidden store's logits, write a store's dataset card, import a hidden-state "
        "fidelity suite's reference.")


def materialize_cmd(
    store: Annotated[str, typer.Argument(help="hidden store folder or hf://datasets/ORG/NAME@REV/sub")],
    out: Annotated[Path, options.out("logit store folder to write (resumes if present)")],
    device: options.Device = None,
    head_from: Annotated[str | None, typer.Option(
        "--head-from", help="the model folder (or hf://ORG/NAME) to take the head from when the store has no head.safetensors")] = None,
    windows: Annotated[Path | None, typer.Option(
        "--windows", help="the eval-windows.json the store was computed on (its sources go into the dataset card)")] = None,
) -> None:
    """Write a hidden store's FP32 logits (replayed through its head) as a logit store, in the seed's format."""
    from fideval.fsio import remove_temps
    from fideval.lock import output_lock
    from fideval.model.device import resolve_device
    from fideval.score.stores import open_store
    from fideval.store.materialize import materialize

    rows = open_store(store, head_from)
    dev = resolve_device(device or "auto")
    with output_lock(out, "materialize"):
        remove_temps(out)
        s = materialize(rows, out, str(dev), windows)
    typer.echo(f"{out}: {s['written']} shards written, {s['skipped']} already done; {s['rows']:,} logit rows, "
               f"{s['bytes'] / 1e9:.3f} GB (the hidden store: {_store_bytes(rows.root) / 1e9:.3f} GB)")


def card_cmd(
    store: Annotated[Path, typer.Argument(help="a finished store folder")],
    windows: Annotated[Path | None, typer.Option(
        "--windows", help="the eval-windows.json the store was computed on (its sources go into the card)")] = None,
) -> None:
    """(Re)write a store's dataset card, README.md in the Hugging Face dataset-card format."""
    from fideval.store import card

    typer.echo(f"{card.write(store, windows)}")


def _store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def import_hidden_suite_cmd(
    suite: Annotated[Path, typer.Argument(help="the suite folder (or shard view) holding suite-manifest.json and tokens/")],
    reference: Annotated[Path, typer.Option(
        "--reference", help="the capture folder: capture-manifest.json and hidden_NNNN.safetensors (e.g. reference/hidden-bf16)")],
    head: Annotated[Path, typer.Option("--head", help="the shared lm head, e.g. lm-head/weight.safetensors")],
    head_sha256: Annotated[str, typer.Option(
        "--head-sha256", help="the SHA-256 of the head file as the suite publishes it (its dataset card, ladder-pin.json)")],
    out: Annotated[Path, options.out("the hidden store folder to write (must not exist)")],
    model_id: Annotated[str | None, typer.Option("--model-id", help="the reference model's Hub id")] = None,
    model_revision: Annotated[str | None, typer.Option(
        "--model-revision", help="its commit (default: the capture manifest's candidate_identity.model_revision)")] = None,
) -> None:
    """Import a hidden-state fidelity suite's reference capture (tools/fidelity.py capture) as a hidden teacher store."""
    import re

    from fideval.errors import FidevalError
    from fideval.store.suite_import import import_suite

    if not re.fullmatch(r"[0-9a-fA-F]{64}", head_sha256.strip()):
        raise FidevalError(f"--head-sha256 {head_sha256!r} is not 64 hex digits", hint="give the head file's SHA-256")
    s = import_suite(suite, reference, head, head_sha256, out, model_id=model_id, model_revision=model_revision)
    typer.echo(f"{out}: {s['contexts']} contexts of {s['length']} tokens, {s['rows']} hidden rows each (positions "
               f"0..{s['length'] - 2}), H {s['hidden_size']}, vocab {s['vocab']}; suite {s['suite_token_sha256'][:16]}…")

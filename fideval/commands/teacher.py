"""``fideval teacher``: the reference model layer by layer over every window/cut, into a teacher store: the final norm's
output and the head (``--store hidden``, the default) or the FP32 logits (``--store logits``)."""

from pathlib import Path
from typing import Annotated

import typer

from fideval.commands import options


def teacher(
    windows: Annotated[Path, typer.Option("--windows", help="output folder of 'fideval windows', or one of its "
                                          "windows-<W>/ or cuts-<C>/ token files (then only that length)")],
    out: Annotated[Path, options.out("teacher store folder to write (resumes if present); with {domain} in it, one store per "
                                     "--domain, run one after another in this process")],
    config: Annotated[Path | None, options.config("take model, device, dtype and run settings from this config")] = None,
    model: Annotated[Path | None, typer.Option("--model", help="Hugging Face checkpoint folder (config.json + safetensors)")] = None,
    lengths: Annotated[str, typer.Option("--lengths", "--kind", help="which sequence folders: windows, cuts or both")] = "windows,cuts",
    domain: Annotated[list[str] | None, typer.Option("--domain", help="only this domain (repeatable); default all")] = None,
    device: options.Device = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="compute dtype of the layers: float32 or bfloat16 (logits are float32 either way)")] = None,
    lm_head: Annotated[str | None, typer.Option(
        "--lm-head", help="the lm head's arithmetic: auto (bf16 products, float32 sums where that is exact: bf16 layers "
        "on a GPU), float32 or bf16 (default: config, else auto)")] = None,
    store: Annotated[str | None, typer.Option(
        "--store", help="what the store keeps: hidden (the final norm's output and the head; every reader replays the FP32 "
        "logits) or logits (the FP32 logits, 517 KB a row at V = 129,280); auto: hidden (default: config, else auto)")] = None,
    micro_batch: Annotated[int | None, typer.Option(
        "--micro-batch", min=1, help="sequences per attention call (default: config, else auto: 1 on a CPU, sized on a GPU)")] = None,
    mlp_tokens: Annotated[str | None, typer.Option(
        "--mlp-tokens", help="MLP/MoE token block spanning micro-batches (throughput mode): N, auto or off "
        "(default: config, else auto: off on a CPU, sized on a GPU)")] = None,
    chunk_bytes: Annotated[str | None, typer.Option(
        "--chunk-bytes", help="hidden-state bytes of one chunk (every layer read once per chunk): N, auto or off (4 GiB)")] = None,
    peak_tflops: Annotated[float | None, typer.Option(
        "--peak-tflops", help="the GPU's dense peak for the utilisation figure (default: by GPU name; unknown: not shown)")] = None,
    model_id: Annotated[str | None, typer.Option("--model-id", help="recorded in the store (default: folder name)")] = None,
    model_revision: Annotated[str | None, typer.Option("--model-revision", help="recorded in the store (default: 'local')")] = None,
    implementation: Annotated[str | None, typer.Option(
        "--implementation", help="transformers, or reference: the vendor's inference code (default: config, else transformers)")] = None,
    code: Annotated[str | None, typer.Option(
        "--code", help="the reference code's folder, relative to the model or absolute (default: config, else inference)")] = None,
    trust_remote_code: Annotated[bool | None, typer.Option(
        "--trust-remote-code/--no-trust-remote-code", help="run the model repo's code (needed by --implementation reference)")] = None,
    reference_experts: Annotated[str | None, typer.Option(
        "--reference-experts", help="the reference code's routed experts: vendor (its loop) or grouped (one GEMM per "
        "projection; default: config, else vendor)")] = None,
    routes: Annotated[bool, typer.Option(
        "--routes", help="also record every MoE layer's routed experts and weights per position into <store>/routes/ "
        "(docs/formats-routes.md; the shards are unchanged); on with --config when a candidate's routing is not off")] = False,
) -> None:
    """Run the reference model layer by layer and store, for every position, the final norm's output (replayed into
    float32 logits by every reader) or the float32 logits themselves.

    For model parallel, launch the library entry point under torchrun:
    ``torchrun --nproc-per-node N -m fideval.model.teacher --model ... --windows ... --out ...``.
    """
    import os

    from fideval.lock import output_lock
    from fideval.model.teacher import run_teacher
    from fideval.model.teacher_pass import sequence_folders

    kinds = tuple(x.strip() for x in lengths.split(",") if x.strip())
    sequence_folders(windows, kinds)  # a bad --windows or --lengths fails before the output folder exists
    args = _settings(config, model=model, model_id=model_id, model_revision=model_revision, device=device,
                     dtype=dtype, micro_batch=micro_batch, mlp_tokens=mlp_tokens, chunk_bytes=chunk_bytes,
                     implementation=implementation, code=code, trust_remote_code=trust_remote_code, lm_head=lm_head,
                     store=store, reference_experts=reference_experts)
    from fideval.model.teacher_pass import store_kind

    args["store"] = store_kind(args.get("store", "auto"), args.get("implementation", "transformers"))  # before any file
    if args.get("implementation", "transformers") not in ("transformers", "reference"):
        from fideval.errors import FidevalError

        raise FidevalError(f"--implementation {args['implementation']!r} is not known", hint="use transformers or reference")
    if args.get("implementation") == "reference":  # trust, code, ModelArgs, the cuts: refused before the store exists
        from fideval.model.reference.runner import check

        check(args["model_dir"], code=args.get("code"), trust=bool(args.get("trust_remote_code")),
              world=int(os.environ.get("WORLD_SIZE", "1")), dtype=args.get("dtype") or "float32")
    if routes:
        args["routes"] = True
    if args.get("lm_head") == "bf16":  # refused before the store folder exists, as the runner would refuse it
        _check_bf16_head(args)
    from fideval.timing.accounting import line

    for store, doms in per_domain(out, domain, "--out"):  # one store, or one per domain (the workflow's jobs)
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun rank 0 alone writes, and holds the lock
            with output_lock(store, "teacher"):
                r = run_teacher(windows_dir=windows, out=store, kinds=kinds, domains=doms, peak_tflops=peak_tflops, **args)
        else:
            r = run_teacher(windows_dir=windows, out=store, kinds=kinds, domains=doms, peak_tflops=peak_tflops, **args)
        st, ran = r["stats"], r["settings"]
        verdict = {True: "identical", False: "DIFFERS", None: "unchecked"}
        canary = ", ".join(f"{c['folder']} {verdict[c.get('identical')]}" for c in r["canaries"]) or "none"
        typer.echo(f"{store}: {r['written']} sequences written, {r['skipped']} already done; canary {canary}; micro-batch "
                   f"{ran['micro_batch']}, mlp tokens {ran['mlp_tokens'] or 'off'}; {line(r['profile'])}; weight loading "
                   f"{st['load_s']:.1f} s ({st['wait_s']:.1f} s not hidden)")


PER_DOMAIN = "{domain}"


def per_domain(out: Path, domains: list[str] | None, option: str) -> list[tuple[Path, list[str] | None]]:
    """(output, its domains) for each run: ``out`` with all ``domains`` (None: every domain), or, where ``out`` names
    ``{domain}``, one output per domain with that domain alone, in the order given (a workflow job covering every
    domain of one length pays the imports once; each domain keeps its own store, lock and resumption)."""
    if PER_DOMAIN not in str(out):
        return [(out, domains or None)]
    if not domains:
        from fideval.errors import FidevalError

        raise FidevalError(f"{option} {out} names {PER_DOMAIN} but no --domain is given", hint="pass --domain D once per domain")
    return [(Path(str(out).replace(PER_DOMAIN, d)), [d]) for d in dict.fromkeys(domains)]


def _check_bf16_head(args: dict) -> None:
    """``--lm-head bf16`` where the setting alone rules it out (fideval.model.execution.head; the head's weights are checked
    by the runner)."""
    from fideval.errors import FidevalError
    from fideval.model.device import resolve_device, resolve_dtype
    from fideval.model.execution import head

    msg = head.setting_refusal(args.get("implementation", "transformers"), resolve_device(args["device"]).type,
                               resolve_dtype(args["dtype"]))
    if msg:
        raise FidevalError(msg, hint=head.HINT)


def _settings(config: Path | None, **given) -> dict:
    """run_teacher's model and settings: the options given, else the config's, else the defaults."""
    from fideval.errors import FidevalError

    got = {k: v for k, v in given.items() if v is not None}
    if config is not None:
        from fideval.config import load_config
        from fideval.model_source import locate

        cfg = load_config(config)
        files = locate(cfg.model.path, cfg.model.revision) if "model" not in got else None
        base = {"model_id": cfg.model.id, "implementation": cfg.model.implementation, "code": cfg.model.code,
                "trust_remote_code": cfg.model.trust_remote_code, "device": cfg.teacher.device, "dtype": cfg.teacher.dtype,
                "reference_experts": cfg.model.reference_experts,
                "micro_batch": cfg.teacher.micro_batch, "mlp_tokens": cfg.teacher.mlp_tokens, "chunk_bytes": cfg.teacher.chunk_bytes,
                "lm_head": cfg.teacher.lm_head, "store": cfg.teacher.store,
                # a candidate's routing (record or decompose) needs the teacher's routes
                "routes": True if any(c.routing != "off" for c in cfg.candidates) else None}
        if files is not None:
            base.update(model=files.folder, model_revision=files.revision or cfg.model.revision)
        else:
            base["model_revision"] = cfg.model.revision
        nullable = ("mlp_tokens", "chunk_bytes")  # null in the config: off, not "not given"
        got = {**{k: v for k, v in base.items() if v is not None or k in nullable}, **got}
    if "model" not in got:
        raise FidevalError("no model given", hint="pass --model DIR or --config CONFIG")
    return {"model_dir": got.pop("model"), "device": "auto", "dtype": "float32", "micro_batch": "auto",
            "mlp_tokens": "auto", "chunk_bytes": "auto", "store": "auto", **got}

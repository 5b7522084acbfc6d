"""``report.json`` (format ``fideval.report`` v4; v1 to v3 still read): what ``fideval report`` measured, from what, how.

Written by ``fideval.report.build``, read by ``fideval card`` and ``fideval check``
(``fideval.report.schema.load_report``). The blocks the card and check read by name (settings,
provenance, each result's identity) are typed here; the figure blocks (MEAN, AGREEMENT, QUANTILE in
``docs/formats-report.md``), comparisons and checks stay JSON objects, since their keys vary by figure and
check. Keys a reader requires are those the report has always been checked for; the rest are optional to
read (older reports may lack them) and always written.

Version 2 (issue 28): a MEAN block's ``ci``/``method`` are the default interval (cluster bootstrap-t on the
figure's scale) with the cluster BCa beside it in ``cluster_bca``; AGREEMENT gains the same default beside
its Wilson intervals; every interval names ``method``, ``unit``, ``resamples``, ``seed``, ``strata`` and
``clusters``; comparisons gain build differences and path ratios with ``excludes``; results gain ``views``;
the report gains ``noise_floor``. A version 1 report is read as it is (its ``ci`` is then the BCa's, and
its ``method`` says so): ``card`` and ``check`` label every interval by its ``method``.

Version 4 (issue 42): ``routing``, the routing fidelity of a mixture-of-experts build (null without routes or
route-controlled records; fideval.report.route_section), and route-controlled records (path ``P+teacher-routes``)
are no ``results`` entry. A version 3 report is read as written (without the key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fideval.formats.model import Model, key

FILE = "report.json"
_HINT = "regenerate it with 'fideval report' of this version"


@dataclass(frozen=True, kw_only=True)
class Settings(Model):
    HINT = _HINT

    resamples: int = key("bootstrap resamples B")
    seed: int = key("seed of `numpy.random.default_rng` for the one resample matrix")
    confidence: float = key("two-sided confidence of every interval, e.g. 0.95")
    quantiles: list[float] = key("the KLD quantiles reported, e.g. [0.5, 0.9, 0.99, 0.999]")
    quantile_method: str = key("numpy's quantile method (`linear`: type 7)")
    clusters: int = key("G, windows with at least one row in some records set")
    domains: list[str] = key("the domains, in report order")
    cluster: str | None = key("the resampling unit's column, `window_id`", default=None)
    resampling: str | None = key("how resamples are drawn, in words", default=None)
    methods: dict[str, str] | None = key("each interval method's name and description", default=None)
    mean: str | None = key("how a mean is taken, in words", default=None)
    card_template: str | None = key("the card body template (config `report.card_template`), or null", default=None)
    strata: str | None = key("the column windows are stratified by when resampled (`domain`)", default=None,
                             since=2)
    intervals: dict[str, Any] | None = key("`default`: the default interval method per kind of figure; "
                                           "`beside`: the intervals printed beside it; `coverage`: where "
                                           "their measured coverage is", default=None, since=2)


@dataclass(frozen=True, kw_only=True)
class Part(Model):
    HINT = _HINT

    records: str = key("the records folder")
    records_sha256: str = key("SHA-256 of its records.parquet")
    score_sha256: str = key("SHA-256 of its score.json")


@dataclass(frozen=True, kw_only=True)
class Input(Part):
    candidate: str = key("the folder's candidate")
    path: str = key("its path")
    length: int = key("its length")


@dataclass(frozen=True, kw_only=True)
class DatasetWindow(Model):
    HINT = _HINT

    id: str = key("window id")
    domain: str = key("its domain")
    token_sha256: str | None = key("SHA-256 of its tokens, from eval-windows.json (null without `--windows`)")


@dataclass(frozen=True, kw_only=True)
class Dataset(Model):
    HINT = _HINT

    name: str = key("the config's `run`, or `fideval-windows`")
    windows_file_sha256: str | None = key("SHA-256 of eval-windows.json (null without `--windows`)")
    sources: dict[str, Any] | None = key("each domain's source, from eval-windows.json or the config")
    windows: list[DatasetWindow] = key("every window, sorted by id")
    windows_without_rows: list[str] = key("windows of eval-windows.json that no records set has")


@dataclass(frozen=True, kw_only=True)
class Provenance(Model):
    HINT = _HINT

    reference: dict[str, Any] = key("`model_id`, `model_revision` (and `trust_remote_code`, `implementation` with "
                                    "`--config`; `reference_code` when a teacher ran the vendor's code: its folder, "
                                    "family, SHA-256 per file, which kernel computed what, and the driver's `model` account where it "
                                    "gives one: DeepSeek-V4.1's schedule and storage dtypes)")
    base_model: str | None = key("config `report.base_model`, else the reference's model id")
    dataset: Dataset = key("the evaluation windows")
    tool: dict[str, Any] = key("fideval's name, version, git commit and Python")
    config_hash: str | None = key("canonical SHA-256 of the config, or null without one")
    teacher_stores: list[dict[str, Any]] | None = key("per length: store, model id and revision, manifest "
                                                      "SHA-256, kind, from score.json; a lossy (llama.cpp) teacher "
                                                      "adds `lossy` and the `lossy_rules` its candidates were scored "
                                                      "with", default=None)
    teacher_manifests: list[dict[str, Any]] | None = key("each `--teacher-manifest`: file, sha256, meta",
                                                         default=None)
    candidates: dict[str, Any] | None = key("per candidate: quant spec or checkpoint, `info` (score.json's "
                                            "candidate_info less `activations` and `run_settings`: model id and "
                                            "revision, source, bits per weight, store manifest SHA-256; one build "
                                            "across all its folders), and how each path and length was scored",
                                            default=None)
    inputs: list[Input] | None = key("one per records folder", default=None)
    self_check_inputs: list[Input] | None = key("one per `--self-check` folder", default=None)


@dataclass(frozen=True, kw_only=True)
class Result(Model):
    HINT = _HINT

    candidate: str = key("candidate name")
    path: str = key("`serving`, `weights-only`, `llamacpp` or `store`")
    length: int = key("sequence length")
    rows: int = key("records rows")
    clusters: int = key("windows with rows")
    overall: dict[str, Any] = key("`mean_kld`, `mean_rkld`, `mean_delta_nll` (MEAN), `top1`, `top5`, `top10` "
                                  "(AGREEMENT), `kld_quantiles` (list of QUANTILE)")
    domains: dict[str, Any] = key("per domain: rows, clusters, `mean_kld`, `top1`, `kld_quantiles`, flags")
    positions: list[dict[str, Any]] = key("mean KLD by position bucket `[start, end)`")
    confidence_buckets: list[dict[str, Any]] = key("top-1 agreement by reference top-1 probability bucket")
    sequences: int | None = key("sequences scored", default=None)
    inputs: list[Part] | None = key("the records folders merged into this set", default=None)
    views: dict[str, Any] | None = key("`micro_macro`, `depth`, `worst_windows`, `top1_flips` (see VIEWS)",
                                       default=None, since=2)


@dataclass(frozen=True, kw_only=True)
class Gates(Model):
    HINT = _HINT

    mean_kld_max: float | None = key("gate on each set's mean KLD, or null")
    top1_min: float | None = key("gate on each set's top-1 agreement, or null")


@dataclass(frozen=True, kw_only=True)
class Plot(Model):
    HINT = _HINT

    file: str = key("PNG file name beside report.json")
    kind: str = key("`kld-cdf`, `kld-position`, `top1-confidence`, `token-classes` or `routing` (per MoE layer: "
                    "the build's routing against the teacher's)")
    candidate: str = key("candidate")
    path: str = key("path")
    length: int = key("length")


@dataclass(frozen=True, kw_only=True)
class Report(Model):
    FORMAT = "fideval.report"
    VERSION = 4
    READABLE = (1, 2, 3, 4)
    KIND = "report format"
    HINT = _HINT

    format: str = key("`fideval.report`", default=FORMAT)
    version: int = key("`4` (`1`, `2`, `3`: read as written)", default=VERSION)
    settings: Settings = key("the statistics' settings")
    provenance: Provenance = key("what was measured, against what, by which fideval")
    results: list[Result] = key("one per records set, sorted by (candidate, path, length)")
    comparisons: dict[str, list[dict[str, Any]]] = key("`builds`, `build_differences`, `paths`, `path_ratios`, "
                                                       "`lengths`: paired ratios and differences (PAIRED)")
    checks: list[dict[str, Any]] = key("`name`, `status` (`pass`, `fail`, `not_run`), `detail`, and the "
                                       "check's own figures")
    gates: Gates = key("the gates `fideval check` applies by default")
    plots: list[Plot] = key("the plots written beside report.json")
    noise_floor: list[dict[str, Any]] | None = key("the reference scored against itself under a harmless "
                                                   "change, per path and length (NOISE), or []",
                                                   default=None, since=2)
    coverage: dict[str, Any] | None = key("the records against what the config and eval-windows.json ask for: "
                                          "`complete` (false: a partial report, written only with --allow-partial), "
                                          "`status`, `detail`, per records set `asked`, `found`, `missing`, "
                                          "`missing_domains`, `first_missing`, and `missing_sets` (version 3)", default=None, since=3)
    token_classes: dict[str, Any] | None = key("figures per token class (`fideval.token-class-figures` v1: `status`, "
                                               "`source`, `classes`, `results`, `comparisons`; docs/formats-classes.md)",
                                               default=None, since=3)
    routing: dict[str, Any] | None = key("routing fidelity of a mixture-of-experts build (`fideval.report-routing` v1: "
                                         "`sets` with the routing figures per candidate, path and length, overall and "
                                         "per MoE layer; `decomposition`: the KLD of the free and the route-controlled "
                                         "run, routing's share and fraction; ROUTING); null when no records have "
                                         "routes and none are route-controlled", default=None, since=4)

    def problem(self) -> str | None:
        """Figures no computation can give (a negative mean KLD, an agreement outside [0, 1]) are refused where
        report.json is read: ``fideval check`` and ``fideval card`` must never pass or print them."""
        for r in self.results:
            who = f"{r.candidate}/{r.path}/{r.length}"
            for name, lo, hi in (("mean_kld", -1e-9, None), ("mean_rkld", -1e-9, None), ("top1", 0.0, 1.0),
                                 ("top5", 0.0, 1.0), ("top10", 0.0, 1.0)):
                fig = r.overall.get(name)
                est = fig.get("estimate") if isinstance(fig, dict) else None
                if isinstance(est, (int, float)) and ((lo is not None and est < lo) or (hi is not None and est > hi)):
                    return f"results {who}: {name} {est!r} is impossible (outside [{lo}, {hi if hi is not None else 'inf'}])"
        return None

"""The one typed configuration model. Everything else (JSON schema for Snakemake, docs, validation) is
generated from these classes, so the config is described exactly once.

Relative paths resolve against the working directory (Snakemake runs from the repository root);
``demo://...`` names a file shipped inside the installed package under ``fideval/demo/assets/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fideval.errors import FidevalError
from fideval.formats.nesting import MAX_DEPTH
from fideval.windows.class_config import TemplateRule, TokenClassesConfig

DEMO_ROOT = Path(__file__).resolve().parent / "demo" / "assets"
HEX40 = re.compile(r"^[0-9a-f]{40}$")
# Names become folder names and, for domains, the stem of every sequence id (fideval/formats/ids.py: file-safe, at most
# 200 characters): kept short enough that no id or path component can outgrow its limit hours into a run.
NAME_MAX = 64


def resolve_path(p: str | Path) -> Path:
    """Resolve a config path: ``demo://x`` -> the packaged demo asset ``x``; else relative to the CWD."""
    s = str(p)
    if s.startswith("demo://"):
        return DEMO_ROOT / s.removeprefix("demo://")
    return Path(s).expanduser()


def is_hub(p: str | Path | None) -> bool:
    """``hf://ORG/NAME`` names a Hub repository, fetched at its pinned revision when a stage needs it."""
    return p is not None and str(p).startswith("hf://")


class Strict(BaseModel):
    # allow_inf_nan=False: a float key is a finite number (YAML's .nan and .inf are refused naming the key)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LocalSource(Strict):
    """Documents from a local file: ``.jsonl`` (one JSON object a line), ``.parquet``, or ``.txt``
    (documents separated by blank lines... see ``fideval/windows/sources.py`` for the exact rule)."""

    type: Literal["local"] = "local"
    path: str = Field(description="file path (jsonl, parquet or txt); demo:// for packaged demo files")
    text_field: str | None = Field(None, description="field holding the document text")
    messages_field: str | None = Field(
        None, description="field holding a list of {role, content} messages, rendered with the chat template"
    )

    @model_validator(mode="after")
    def _one_field(self) -> "LocalSource":
        if self.text_field and self.messages_field:
            raise ValueError("give text_field or messages_field, not both")
        return self


class HubSource(Strict):
    """A Hugging Face ``datasets`` dataset pinned by revision."""

    type: Literal["hf"] = "hf"
    id: str = Field(description="dataset id on the Hub, e.g. 'HuggingFaceFW/fineweb-edu'")
    config: str | None = Field(None, description="dataset configuration name")
    split: str = "train"
    revision: str = Field(description="git revision; a 40-hex commit for reproducible runs")
    text_field: str | None = None
    messages_field: str | None = None
    streaming: bool = Field(True, description="stream rows instead of downloading the whole split")

    @model_validator(mode="after")
    def _one_field(self) -> "HubSource":
        if self.text_field and self.messages_field:
            raise ValueError("give text_field or messages_field, not both")
        return self


Source = Annotated[LocalSource | HubSource, Field(discriminator="type")]


class Domain(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=NAME_MAX,
                      description=f"short domain name used in file names, sequence ids and tables (at most {NAME_MAX} characters)")
    source: Source
    kind: Literal["text", "chat"] = Field(
        "text", description="'chat' domains are screened per conversation (stricter threshold) before packing"
    )


class ModelRef(Strict):
    path: str = Field(
        description="checkpoint folder in the Hugging Face layout (config.json, *.safetensors), or hf://ORG/NAME"
        " fetched at `revision`"
    )
    id: str = Field(description="model id recorded in reports and cards, e.g. 'deepseek-ai/DeepSeek-V3'")
    revision: str | None = Field(None, description="the checkpoint's Hub commit, recorded for provenance")
    tokenizer: str | None = Field(None, description="tokenizer folder; defaults to the model folder")
    trust_remote_code: bool = Field(False, description="run the checkpoint's own Python code (logged in the report)")
    implementation: Literal["transformers", "reference"] = Field(
        "transformers", description="what computes the model: transformers' modules, or the vendor's own reference "
        "code (DeepSeek's inference/model.py, layer by layer; needs trust_remote_code; docs/runner.md)")
    code: str = Field("inference", description="the reference code's folder (with model.py): relative to the model "
                      "folder, or an absolute path; read only with implementation: reference")
    reference_experts: Literal["vendor", "grouped"] = Field(
        "vendor", description="the reference code's routed experts: vendor, its MoE's own loop over experts; grouped, "
        "tokens sorted by expert and one GEMM per projection over all of them, with the vendor's router, weights, "
        "activation quantization and SwiGLU (docs/runner.md, 'Grouped experts'); read only with implementation: reference")

    @model_validator(mode="after")
    def _reference_needs_trust(self) -> "ModelRef":
        if self.implementation == "reference" and not self.trust_remote_code:
            raise ValueError("implementation: reference runs the model repository's own Python code; "
                             "set model.trust_remote_code: true")
        return self


class WindowsConfig(Strict):
    window_tokens: int = Field(8192, gt=0, description="tokens per evaluation window")
    cut_tokens: int = Field(2048, gt=0, description="tokens per cut; each cut runs as a fresh sequence")
    windows_per_domain: int = Field(4, gt=0)
    seed: int = Field(0, ge=0, description="seed of the document sampling (an integer >= 0)")
    separator: Literal["eos", "bos", "bos_eos", "none"] = Field(
        "eos", description="how packed documents are joined: EOS after each, BOS before each, both, or nothing"
    )

    @model_validator(mode="after")
    def _cut_divides(self) -> "WindowsConfig":
        if self.cut_tokens > self.window_tokens or self.window_tokens % self.cut_tokens:
            raise ValueError(
                f"cut_tokens ({self.cut_tokens}) must divide window_tokens ({self.window_tokens})"
            )
        return self


class ScreenConfig(Strict):
    calibration: list[Source] = Field(default_factory=list, description="the data the quant was calibrated on")
    ngram: int = Field(13, ge=1)
    unit: Literal["words", "tokens"] = Field("words", description="normalised-word 13-grams (default) or token ids")
    max_window_fraction: float = Field(0.05, ge=0, le=1)
    max_conversation_fraction: float = Field(0.02, ge=0, le=1)
    max_replacements: int = Field(64, ge=0, description="give up after this many rebuilt windows per domain")


class TeacherConfig(Strict):
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where `fideval teacher` and `fideval score --config` run when --device is not given "
        "(the workflow's rules pass --device from their gpu resource)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="compute dtype of the layers; logits are FP32")
    model_parallel: int = Field(1, ge=1, description="ranks (torchrun) over which experts and heads are split")
    lengths: list[Literal["windows", "cuts"]] = Field(
        default_factory=lambda: ["windows", "cuts"], description="which sequences the workflow runs the teacher on and scores")
    micro_batch: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="sequences per attention call; auto: 1 on a CPU, sized from the GPU's free memory on CUDA "
        "(docs/runner.md, 'Run settings and accounting'). Shapes the bits: the number run is recorded in the teacher store "
        "and candidates use it")
    mlp_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="the throughput mode: MLP/MoE over blocks of up to this many tokens spanning micro-batches; "
        "null: whole layers per micro-batch; auto: null on a CPU, sized on CUDA (65,536 where memory allows). Recorded "
        "like micro_batch")
    chunk_bytes: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="hidden-state bytes of the sequences that go through the layers together (each chunk reads "
        "every layer's weights once); null: the runner's 4 GiB; auto: null on a CPU, what the GPU holds beside the "
        "weights and the largest layer phase on CUDA. Recorded like micro_batch")
    lm_head: Literal["auto", "float32", "bf16"] = Field(
        "auto", description="the lm head's arithmetic: float32 (float32 GEMM, no TF32) or bf16 (the same bfloat16 "
        "operands on the tensor cores, float32 sums and logits); auto: bf16 where its products are the float32 head's "
        "(bfloat16 layers on a GPU, a bfloat16 head), else float32 (docs/runner.md). Recorded like micro_batch")
    store: Literal["auto", "hidden", "logits"] = Field(
        "auto", description="what the teacher store keeps per position: `hidden`, the final norm's output (H values in "
        "the layers' dtype, 14 KB a row at DeepSeek-V3 sizes in bfloat16) with the lm head as used beside it, from which "
        "every reader replays the FP32 logits on its device; or `logits`, the FP32 logits themselves (V x 4 bytes a row, "
        "517 KB at V = 129,280), the seed's format; auto: hidden, with either backend (the reference code's head is "
        "replayed in the mode its run used: the vendor's float32 F.linear, or bf16 on a GPU: docs/formats-store.md)")
    fused: bool = Field(
        False, description="run the teacher and every emulated candidate (both paths) in one pass per length and "
        "domain (`fideval fused`): each layer read once, candidates scored against the teacher's logits on the GPU "
        "instead of reading its store back; the store and records are the separate passes' bits. One GPU, "
        "transformers implementation; real builds keep their own pass (docs/runner.md, 'The fused pass')")


class ModuleQuant(Strict):
    format: str = Field(description="target format, e.g. mxfp4, nvfp4, fp8_block, gguf_q4_0, int4")
    recipe: str | None = Field(None, description="encoder recipe, e.g. rceil or floor for MX; default per format")
    group: int | None = Field(None, gt=0, description="group/block size where the format allows a choice")


class QuantSpec(Strict):
    routed_experts: ModuleQuant | None = None
    shared_experts: ModuleQuant | None = None
    attention: ModuleQuant | None = None
    dense_mlp: ModuleQuant | None = None
    lm_head: ModuleQuant | None = None
    gguf_mix: str | None = Field(None, description="a llama-quantize named mix (Q4_K_M, Q5_K_M, Q3_K_M, IQ4_XS, Q8_0...): every "
                                 "weight, token embedding and lm head included, gets the type llama-quantize gives it, in "
                                 "llama.cpp's layout; alone, without module classes (docs/quant.md)")

    @model_validator(mode="after")
    def _mix_alone(self) -> "QuantSpec":
        if self.gguf_mix is not None and any(getattr(self, c) is not None for c in
                                             ("routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head")):
            raise ValueError("gguf_mix decides every tensor's type; give it without module classes")
        return self


class Candidate(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=NAME_MAX,
                      description=f"candidate name used in folder names, records and tables (at most {NAME_MAX} characters)")
    quant: QuantSpec | None = Field(None, description="emulated quantization applied to the reference checkpoint")
    checkpoint: str | None = Field(None, description="a real quantized checkpoint (GGUF file or folder) instead")
    imatrix: str | None = Field(None, description="a llama.cpp importance matrix (llama-imatrix's GGUF or legacy .dat) "
                                "for the gguf formats of `quant` llama.cpp quantizes with one (gguf_q2_k..gguf_q6_k, gguf_iq4_nl, "
                                "gguf_iq4_xs, gguf_q4_0, gguf_q4_1, gguf_q5_0, gguf_q5_1) or its gguf_mix, "
                                "used as llama-quantize --imatrix uses it")
    paths: list[Literal["serving", "weights-only", "llamacpp"]] = Field(
        default_factory=lambda: ["serving", "weights-only"],
        description="'serving' quantizes activations entering quantized modules to E4M3 per 1x128; 'weights-only' does not; "
                    "'llamacpp' (GGUF candidates: a .gguf checkpoint or gguf_mix) rounds each quantized linear's input as "
                    "llama.cpp's CPU backend does for the tensor's GGML type (Q8_0/Q8_1/Q8_K/F16; docs/quant.md)",
    )

    routing: Literal["off", "record", "decompose"] = Field(
        "off", description="routing fidelity of a mixture-of-experts build (docs/formats-routes.md): 'record' records the "
        "teacher's and this candidate's routed experts per MoE layer and position and reports how often they agree; "
        "'decompose' also runs each path again with the teacher's routes forced into the candidate's MoE layers "
        "(path '<path>+teacher-routes'): its KLD is the expert arithmetic's share, the rest is routing's")

    @model_validator(mode="after")
    def _one_source(self) -> "Candidate":
        if (self.quant is None) == (self.checkpoint is None):
            raise ValueError("give exactly one of quant (emulated) or checkpoint (real quantized build)")
        if self.imatrix is not None and self.quant is None:
            raise ValueError("imatrix applies to an emulated candidate's gguf formats or gguf_mix (quant), not to a checkpoint")
        return self


class ScoreConfig(Strict):
    cpu_check_every: int = Field(1000, ge=1, description="check 1 row in this many (plus first/last) on the CPU in float64")
    cpu_check_tolerance: float = Field(2e-12, gt=0, description="`fideval score --config` fails when a checked row's relative "
                                       "difference to the float64 reference exceeds this (--cpu-check-tolerance overrides)")
    on_nonfinite: Literal["fail", "skip"] = Field("fail", description="rows holding NaN/+inf fail the run, or are dropped and counted")


class Gates(Strict):
    mean_kld_max: float | None = Field(None, ge=0, description="fail `fideval check` when mean KLD exceeds this")
    top1_min: float | None = Field(None, ge=0, le=1)


class NoiseFloor(Strict):
    micro_batch: int = Field(2, ge=1, description="the harmless change: the teacher is run again with this many "
                             "sequences per attention call, and its logits are scored against the reference's")


class ReportConfig(Strict):
    resamples: int = Field(10_000, ge=100, description="bootstrap resamples B")
    seed: int = Field(0, ge=0, description="seed of the bootstrap resamples (an integer >= 0)")
    confidence: float = Field(0.95, gt=0.5, lt=1)
    quantiles: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        default_factory=lambda: [0.5, 0.9, 0.99, 0.999], description="KLD quantiles reported, each strictly between 0 and 1")
    gates: Gates = Field(default_factory=Gates)
    base_model: str | None = Field(None, description="model-card base_model; defaults to model.id")
    card_template: str | None = Field(None, description="a jinja2 template replacing the card's markdown body")
    noise_floor: NoiseFloor | None = Field(None, description="the noise floor: the reference against itself under "
                                           "a harmless change, scored like a build (null: not run)")


class Config(Strict):
    """A whole evaluation: which model, which data, which candidates, how to report."""

    run: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=NAME_MAX,
                     description=f"run name: results/<run>/, reports/<run>/ (at most {NAME_MAX} characters)")
    strict: bool = Field(False, description="require 40-hex revisions for every model and dataset")
    model: ModelRef
    domains: list[Domain] = Field(min_length=1)
    windows: WindowsConfig = Field(default_factory=WindowsConfig)
    screen: ScreenConfig = Field(default_factory=ScreenConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    candidates: list[Candidate] = Field(default_factory=list)
    score: ScoreConfig = Field(default_factory=ScoreConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    token_classes: TokenClassesConfig = Field(default_factory=TokenClassesConfig,
                                              description="rules that tag each token with its classes (docs/formats-classes.md)")

    @field_validator("domains")
    @classmethod
    def _unique_domains(cls, v: list[Domain]) -> list[Domain]:
        names = [d.name for d in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"domain names repeat: {sorted(dup)}")
        return v

    @field_validator("candidates")
    @classmethod
    def _unique_candidates(cls, v: list[Candidate]) -> list[Candidate]:
        names = [c.name for c in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"candidate names repeat: {sorted(dup)}")
        return v

    @model_validator(mode="after")
    def _strict_revisions(self) -> "Config":
        if not self.strict:
            return self
        revs = [("model.revision", self.model.revision)]
        revs += [(f"domains.{d.name}.source.revision", d.source.revision) for d in self.domains if d.source.type == "hf"]
        revs += [(f"screen.calibration[{i}].revision", s.revision) for i, s in enumerate(self.screen.calibration) if s.type == "hf"]
        for key, rev in revs:
            if rev is None or not HEX40.match(rev):
                raise ValueError(f"{key} must be a 40-hex commit in strict mode, got {rev!r}")
        return self

    def as_plain(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def json_schema() -> dict[str, Any]:
    """The JSON schema Snakemake's ``validate()`` checks the config against (generated, never hand-written)."""
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["description"] = "fideval evaluation config (generated from fideval/config.py; do not edit)"
    return schema


def _format_error(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in ("local", "hf")))
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown key '{loc}'"
    if kind == "missing":
        return f"missing key '{loc}'"
    msg = err["msg"].removeprefix("Value error, ")
    return f"'{loc}': {msg}" if loc else msg


def parse_config(data: Any, *, origin: str = "config") -> Config:
    if not isinstance(data, dict):
        raise FidevalError(f"{origin}: the config must be a mapping of keys to values",
                           hint="write 'key: value' lines at the top level; see docs/config.md")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        raise FidevalError(f"{origin}: {_format_error(first)}{more}", hint="see docs/config.md") from None


class ConfigShapeError(yaml.YAMLError):
    """A YAML document :class:`ConfigLoader` refuses although YAML allows it: ``line`` (1-based), what, and the fix."""

    def __init__(self, line: int, what: str, hint: str):
        super().__init__(f"line {line}: {what}")
        self.line, self.what, self.hint = line, what, hint


class ConfigLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader (the same tags and types: no ``!!python/...``) with two refusals PyYAML lacks:

    * a key given twice in one mapping (PyYAML keeps the last one, silently; merge keys ``<<`` may still be
      overridden, as YAML means them to be);
    * nesting deeper than :data:`fideval.formats.nesting.MAX_DEPTH` levels, counted while composing (PyYAML
      recurses, and fails with a ``RecursionError`` traceback a few hundred levels down), and again through
      aliases (an alias of a deep node in a deep place; an alias inside the node it names is refused too).
    """

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._levels = 0

    def _enter(self) -> None:
        self._levels += 1
        if self._levels > MAX_DEPTH:
            raise ConfigShapeError(self.peek_event().start_mark.line + 1, f"is nested deeper than {MAX_DEPTH} levels",
                                   "a config is a few levels deep (docs/config.md); fix the file")

    def compose_sequence_node(self, anchor: Any) -> Any:
        self._enter()
        try:
            return super().compose_sequence_node(anchor)
        finally:
            self._levels -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        self._enter()
        try:
            return super().compose_mapping_node(anchor)
        finally:
            self._levels -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            self._check_tree(node)
        return node

    def _key(self, node: Any) -> Any:
        """A scalar key as the constructor will build it (so ``1`` and ``0x1`` are one key), else its text."""
        make = self.yaml_constructors.get(node.tag)
        try:
            key = make(self, node) if make is not None else (node.tag, node.value)
            hash(key)
            return key
        except Exception:  # noqa: BLE001 -- the constructor reports a bad key itself, later
            return (node.tag, node.value)

    def _check_tree(self, root: Any) -> None:
        """Each mapping's keys once, and every node's height (aliases followed, each node measured once)."""
        heights: dict[int, int] = {}
        open_: set[int] = set()

        def visit(node: Any, level: int, path: list[str]) -> int:
            if isinstance(node, yaml.ScalarNode):
                return 0
            key = id(node)
            where = node.start_mark.line + 1
            if key in open_:
                raise ConfigShapeError(where, f"an alias makes '{'.'.join(path) or 'the top level'}' contain itself",
                                       "a config holds no recursive structure; remove the alias")
            if key in heights:
                if level - 1 + heights[key] > MAX_DEPTH:
                    raise ConfigShapeError(where, f"is nested deeper than {MAX_DEPTH} levels (through an alias)",
                                           "a config is a few levels deep (docs/config.md); fix the file")
                return heights[key]
            if level > MAX_DEPTH:
                raise ConfigShapeError(where, f"is nested deeper than {MAX_DEPTH} levels (through an alias)",
                                       "a config is a few levels deep (docs/config.md); fix the file")
            open_.add(key)
            children: list[tuple[Any, list[str]]] = []
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for k, v in node.value:
                    if k.tag == "tag:yaml.org,2002:merge":
                        children.append((v, path))
                        continue
                    label = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
                    if isinstance(k, yaml.ScalarNode):
                        name = self._key(k)
                        if name in seen:
                            raise ConfigShapeError(k.start_mark.line + 1, f"key '{'.'.join([*path, label])}' is given "
                                                   f"twice (first on line {seen[name]})",
                                                   "keep one: YAML would silently keep the last")
                        seen[name] = k.start_mark.line + 1
                    children += [(k, [*path, label]), (v, [*path, label])]
            else:
                children = [(v, [*path, str(i)]) for i, v in enumerate(node.value)]
            h = 1 + max((visit(c, level + 1, p) for c, p in children), default=0)
            open_.discard(key)
            heights[key] = h
            return h

        visit(root, 1, [])


def read_yaml(path: str | Path) -> Any:
    """A YAML config file's data as ``yaml.safe_load`` gives it (:class:`ConfigLoader`: the same tags), with a key
    given twice and nesting deeper than MAX_DEPTH refused; every problem one :class:`FidevalError` line naming the
    file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FidevalError(f"config file {path} not found", hint="check the path") from None
    except UnicodeDecodeError as e:
        raise FidevalError(f"{path}: byte {e.start} is not UTF-8 text", hint="save the config as UTF-8 YAML") from None
    except OSError as e:
        raise FidevalError(f"cannot read config {path}: {e.strerror}", hint="give a readable YAML file") from None
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 -- ConfigLoader is a SafeLoader
    except ConfigShapeError as e:
        raise FidevalError(f"{path}: line {e.line} {e.what}" if e.what.startswith("is ") else f"{path}: line {e.line}: {e.what}",
                           hint=e.hint) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise FidevalError(f"{path}:{where} is not valid YAML", hint="fix the syntax") from None
    except RecursionError:  # not reached while ConfigLoader bounds the depth; kept so no document is a traceback
        raise FidevalError(f"{path} is nested deeper than {MAX_DEPTH} levels",
                           hint="a config is a few levels deep (docs/config.md); fix the file") from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; raise :class:`FidevalError` with one line on any problem."""
    return parse_config(read_yaml(path), origin=str(path))


def check_files(cfg: Config) -> list[str]:
    """Problems a schema cannot see: files that are missing. Returns one line per problem."""
    problems = []

    def need(key: str, p: str | None, kind: str = "file") -> None:
        if p is None or is_hub(p):  # Hub references are resolved (and checked) when the stage runs
            return
        rp = resolve_path(p)
        if not rp.exists():
            problems.append(f"'{key}': {kind} {p} does not exist")

    need("model.path", cfg.model.path, "folder")
    if not is_hub(cfg.model.path) and resolve_path(cfg.model.path).is_dir() and not (resolve_path(cfg.model.path) / "config.json").exists():
        problems.append(f"'model.path': {cfg.model.path} has no config.json (expected a Hugging Face checkpoint folder)")
    need("model.tokenizer", cfg.model.tokenizer, "folder")
    for d in cfg.domains:
        if d.source.type == "local":
            need(f"domains.{d.name}.source.path", d.source.path)
    for i, s in enumerate(cfg.screen.calibration):
        if s.type == "local":
            need(f"screen.calibration[{i}].path", s.path)
    for c in cfg.candidates:
        need(f"candidates.{c.name}.checkpoint", c.checkpoint, "checkpoint")
        need(f"candidates.{c.name}.imatrix", c.imatrix, "imatrix file")
    if cfg.report.card_template:
        need("report.card_template", cfg.report.card_template)
    return problems


def markdown_reference() -> str:
    """docs/config.md, generated from the model so the reference can never drift from the code."""
    from pydantic.fields import FieldInfo

    def type_name(annotation: Any) -> str:
        from typing import get_origin

        text = str(annotation) if get_origin(annotation) is not None else getattr(annotation, "__name__", str(annotation))
        text = re.sub(r"Annotated\[(.*?), FieldInfo\(.*\)\]", r"\1", text)
        return text.replace("typing.", "").replace("fideval.config.", "").replace("NoneType", "None")

    def default_of(info: FieldInfo) -> str:
        if info.is_required():
            return "**required**"
        if info.default_factory is not None:
            value = info.default_factory()
            return "see its section" if isinstance(value, BaseModel) else f"`{value}`"
        return f"`{info.default}`"

    sections = [("top level", Config), ("model", ModelRef), ("domains[]", Domain), ("source (local)", LocalSource),
                ("source (hf)", HubSource), ("windows", WindowsConfig), ("screen", ScreenConfig),
                ("teacher", TeacherConfig), ("candidates[]", Candidate), ("candidates[].quant", QuantSpec),
                ("quant module", ModuleQuant), ("score", ScoreConfig), ("report", ReportConfig), ("report.gates", Gates),
                ("token_classes", TokenClassesConfig), ("token_classes.templates[]", TemplateRule)]
    out = ["# Config reference", "",
           "Generated from `fideval/config.py` by `fideval schema --format markdown`; do not edit by hand.",
           "Unknown keys are errors. Relative paths resolve against the working directory; `demo://x` names a",
           "packaged demo asset; `hf://ORG/NAME` names a Hub repository fetched at its `revision`. Every number is",
           f"finite (`.nan`, `.inf` are refused); a key given twice in one mapping, and nesting deeper than {MAX_DEPTH} levels,",
           "are refused too. The JSON schema (`fideval schema`) holds every bound (minimum, maximum, pattern, length).", ""]
    for title, model in sections:
        out += [f"## {title}", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            desc = (info.description or "").replace("|", "\\|")
            out.append(f"| `{name}` | `{type_name(info.annotation)}` | {default_of(info)} | {desc} |")
        out.append("")
    return "\n".join(out)

"""``model.implementation: reference``: what the reference-code backend would refuse, found in seconds.

Asked of the very code the run uses (:func:`fideval.model.reference.runner.open_driver`, from config.json
alone: no weight is read, none need be local): the code folder (``model.code``), the trust flag, the code
defining the classes its family driver uses, a config.json the vendor's ``ModelArgs`` cannot take
(``model.path``), and a ``teacher.model_parallel`` that does not divide what the vendor's code cuts
(vocabulary, experts, heads). Importing the code runs it: validate does so only under
``model.trust_remote_code: true``, as the run would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fideval.errors import FidevalError
from fideval.validate.findings import Findings

if TYPE_CHECKING:
    from fideval.config import Config



def check(cfg: Config, folder, found: Findings):
    """Problems of a reference-backend config with its model in ``folder`` (None: not local yet, a note). Returns the
    driver at ``teacher.model_parallel`` when the code accepts the config (what attention sizing asks), else None."""
    if getattr(cfg.model, "implementation", "transformers") != "reference":
        return None
    if folder is None:
        found.notes.append("the reference code is checked once the model folder is local")
        return None
    from fideval.model.reference.code import resolve_code_dir
    from fideval.model.reference.runner import check as check_code

    try:
        code = resolve_code_dir(folder, cfg.model.code)
    except FidevalError as e:
        found.add("model.code", e)
        return None
    from fideval.model.device import resolve_dtype

    dtype = resolve_dtype(cfg.teacher.dtype)
    try:
        driver = check_code(folder, code=cfg.model.code, trust=cfg.model.trust_remote_code, dtype=dtype)
    except FidevalError as e:
        key = "model.code" if str(code) in e.message else "teacher.dtype" if f"not {dtype}" in e.message else "model.path"
        found.add(key, e)
        return None
    n = cfg.teacher.model_parallel
    if n > 1:
        try:
            driver = check_code(folder, code=cfg.model.code, trust=cfg.model.trust_remote_code, world=n, dtype=dtype)
        except FidevalError as e:
            found.add("teacher.model_parallel", e)
            return None
    return driver

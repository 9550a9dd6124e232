"""Collection rules for the whole repository (tests/ and the doctests of pipeline/).

A module of an optional extra is collected for doctests only where the extra is installed: without it,
importing the module raises ImportError by design (``pipeline/router/litellm_hook.py`` needs LiteLLM;
its tests skip with the install command, ``tests/unit/test_router_litellm.py``; the same for
``pipeline/gateways/litellm.py`` and the ``otel`` extra's ``pipeline/gateways/otlp*.py``).
"""

import importlib.util
import os

# LiteLLM fetches its price list over the network at import unless told to use the copy in its wheel:
# the tests (and the subprocesses they start) never need the network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_LITELLM = ["pipeline/router/litellm_hook.py", "pipeline/gateways/litellm.py"]
collect_ignore = [] if importlib.util.find_spec("litellm") else list(_LITELLM)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


if not (_installed("opentelemetry.proto") and _installed("google.protobuf")):
    collect_ignore += ["pipeline/gateways/otlp.py", "pipeline/gateways/otlp_ingest.py"]

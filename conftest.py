"""Collection rules for the whole repository (tests/ and the doctests of pipeline/).

A module of an optional extra is collected for doctests only where the extra is installed: without it,
importing the module raises ImportError by design (``pipeline/router/litellm_hook.py`` needs LiteLLM;
its tests skip with the install command, ``tests/unit/test_router_litellm.py``).
"""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("litellm") else ["pipeline/router/litellm_hook.py"]

"""The Lua scripts: what each takes (``headers``), their text and library (``assembly``), the
wire a call goes over (``wire``) and the runner that calls them (``runner``). A script's header
(the leading comment block of its file) is its contract; docs/architecture.md places the layer.
"""

from .assembly import SCRIPT_NAMES, compose, library, source
from .headers import Layout, header, header_errors, signature
from .runner import FIRST_SEND, LuaScript, get_scripts, resent, run_replicated
from .wire import Flight, set_spin_wait

__all__ = [
    "FIRST_SEND",
    "SCRIPT_NAMES",
    "Flight",
    "Layout",
    "LuaScript",
    "compose",
    "get_scripts",
    "header",
    "header_errors",
    "library",
    "resent",
    "run_replicated",
    "set_spin_wait",
    "signature",
    "source",
]

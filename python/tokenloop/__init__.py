"""tokenloop for Python: GGUF models on the CPU through tokenloop's C library
(bundled as libtokenloop.so, bound with ctypes).

    import tokenloop
    m = tokenloop.Model("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    m.generate("The capital of France is", max_tokens=16, temperature=0)
    m.chat([{"role": "user", "content": "Hi"}])
    m.create_chat_completion(messages=[...])   # OpenAI-shaped, as llama-cpp-python's

docs/PYTHON.md in the repository has the rest."""
from ._lib import lib_path
from .errors import (ArgumentError, ContextFullError, FileError, FormatError, OutOfMemoryError, TokenloopError,
                     UnsupportedError)
from .model import Model
from .compat import Llama

__all__ = ["Model", "Llama", "TokenloopError", "FileError", "FormatError", "ArgumentError", "UnsupportedError",
           "ContextFullError", "OutOfMemoryError", "json_schema_to_gbnf", "__version__", "lib_path"]


try:
    from importlib.metadata import version as _version
    __version__ = _version("tokenloop")
except Exception:  # imported from the source folder
    __version__ = "unknown"


def json_schema_to_gbnf(schema):
    """The GBNF grammar the library makes of a JSON Schema (dict or text)."""
    import ctypes
    import json
    from . import _lib
    from .errors import check
    text = schema if isinstance(schema, (str, bytes)) else json.dumps(schema)
    data = text.encode() if isinstance(text, str) else text
    out = ctypes.c_void_p()
    err = _lib.Error()
    check(_lib.lib.tl_json_schema_to_gbnf(data, len(data), ctypes.byref(out), ctypes.byref(err)), err, "json_schema")
    try:
        return ctypes.string_at(out).decode()
    finally:
        _lib.lib.tl_free(out)

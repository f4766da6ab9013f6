"""A sans-IO AMQP 0-9-1 codec: frames, field tables, content properties, and a fast
path for publishing and consuming.

This package never does I/O, never reads the clock and never imports an async
library.  Feed it bytes, get values back; give it values, get bytes back.
"""

from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._events import *  # noqa: F403
from ._events import __all__ as _events_all
from ._fast import *  # noqa: F403
from ._fast import __all__ as _fast_all
from ._frames import *  # noqa: F403
from ._frames import __all__ as _frames_all
from ._methods import *  # noqa: F403
from ._methods import __all__ as _methods_all
from ._properties import *  # noqa: F403
from ._properties import __all__ as _properties_all
from ._protocol import *  # noqa: F403
from ._protocol import __all__ as _protocol_all
from ._table import *  # noqa: F403
from ._table import __all__ as _table_all

# isort: split
# The C versions of the hot path when ojs_codec._speedups is loaded (they replace the
# pure-Python names imported above); see codec/ojs_codec/_accel.py.
from ._accel import SPEEDUPS
from ._hot import *  # noqa: F403

__all__ = [
    "SPEEDUPS",
    *_errors_all,
    *_table_all,
    *_properties_all,
    *_frames_all,
    *_methods_all,
    *_fast_all,
    *_events_all,
    *_protocol_all,
]

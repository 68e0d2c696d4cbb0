"""psgate-trace v1: reading, validating, writing and hashing request traces.

The bottom of the stack: every other room reads traces through this one, so it imports
only errors, resources, atomic writes and the contract table (trace stats' refill rates),
never a policy, an engine or the receipt. Content keys (``keys``) live here because the
engines, the trace's future and trace stats must number cached content alike; importers
turn public request logs into traces.
"""

from psgate.trace.model import (CancelEvent, DoneEvent, RequestEvent, TraceHeader,
                                TraceSummary)
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

__all__ = [
    "CancelEvent", "DoneEvent", "HashTable", "RequestEvent", "TraceHeader", "TraceReader",
    "TraceSource", "TraceSummary", "validate_trace",
]

"""psgate-trace v1: reading, validating, writing and hashing request traces."""

from psgate.trace.model import (CancelEvent, DoneEvent, RequestEvent, TraceHeader,
                                TraceSummary)
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

__all__ = [
    "CancelEvent", "DoneEvent", "HashTable", "RequestEvent", "TraceHeader", "TraceReader",
    "TraceSource", "TraceSummary", "validate_trace",
]

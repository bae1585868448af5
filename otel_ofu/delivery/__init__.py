"""Delivery for network exporters: a bounded sending queue, consumer threads, retries.

An exporter's ``export()`` only encodes and enqueues (:class:`Delivery.submit`); consumer
threads send from the queue, retrying retryable failures with exponential backoff, so a
receiver never stalls while a backend is down. The queue lives in memory or, with a storage
directory, in SQLite so that accepted data survives a crash or restart.
"""

from otel_ofu.delivery.queue import BoundedQueue, Item, MemoryStore, SqliteStore
from otel_ofu.delivery.retry import Backoff, SendResult
from otel_ofu.delivery.sender import Delivery, DeliveryOptions

__all__ = ["Backoff", "BoundedQueue", "Delivery", "DeliveryOptions", "Item", "MemoryStore", "SendResult",
           "SqliteStore"]

"""The local-disk hot tier: per-partition segment files with an offset index.

Layout, per partition (``<path>`` is :attr:`PartitionId.path`)::

    <hot_path>/<path>/
        00000000000000000000.log     segment: batch records, append only
        00000000000000000000.index   its offset index
        00000000000000004096.log     the next segment, named by its first offset
        00000000000000004096.index
        state.json                   low mark, high watermark, producer state snapshot,
                                     whether any record carries keys (``keyed``)
        keys.idx                     a primary-key table's key index checkpoint
                                     (:mod:`gateway.hot.disk.keyindex`)

Record format (big endian), one per appended batch::

    magic         4s   b"TGB\\x01"
    crc32         u32  zlib.crc32 of every byte after this field (rest of header,
                       producer id and payload)
    payload_len   u32
    base_offset   i64
    count         u32
    timestamp_us  i64
    flags         u8   bit 0: the batch carries a producer identity
    sequence      i64  producer sequence (-1 without a producer)
    producer_len  u16  length of the UTF-8 producer id that follows
    producer_id   producer_len bytes
    payload       payload_len bytes

A primary-key table's batch carries its keys (version 2 of the record, so its key index can
be rebuilt from the log): magic ``b"TGB\x02"``, flags bit 1 set, a ``keys_len u32`` after
``producer_len``, and a key block of ``keys_len`` bytes (``u32 length, bytes`` per record,
in record order) between the producer id and the payload, under the same CRC. Batches
without keys are written as version 1, and both versions are read.

Index format: fixed 16-byte entries ``(base_offset i64, position u32, payload_len u32)``, one
per batch, in offset order. Positions are 32-bit, so a segment never grows past 4 GiB. The
index is a cache of the log: it is written after the record and never fsynced; recovery
checks it against the log and rebuilds whatever it misses.

``state.json`` is written atomically (temporary file, fsync, rename) when a partition is
opened, when a segment rolls, on every trim (before any segment is deleted) and on close.
It holds the logical low mark, the high watermark at the time of writing and the producer
windows of every batch below that watermark. Recovery replays the headers of later batches
on top of it, so producer state survives both a restart and the trimming of the segments
that held it.

Trimming is logical per batch (the low mark moves to the first batch that ends above the
trim offset, exactly as the contract says) and physical per segment (files whose every batch
lies below the low mark are deleted). When everything is trimmed, the active segment is
rolled first, so an empty segment named by the high watermark keeps it on disk.

Concurrency and durability: each partition has its own lock, taken for appends (write and
index update only), reads, trims and recovery, and a second *sync* lock that serialises
fsyncs. Under ``fsync="batch"`` an append writes under the lock, then fsyncs outside it
(group commit: one fsync covers every batch written before it started) and returns once
its batch is durable; readers see only durable batches, so nothing that could vanish in a
power cut is ever served. ``"interval"`` fsyncs from one background thread every
``fsync_interval_ms``; ``"never"`` leaves it to the OS. A failed fsync poisons the partition
(later appends raise :class:`Unavailable`) because the kernel may have dropped the dirty
pages: the next process start recovers from what is really on disk.

Recovery (on the first use of a partition): for every segment, load the index, keep the
longest prefix of plausible entries, verify the last one against the log (header, CRC,
base offset), scan the log onward from there and truncate the log and the index at the
first torn or CRC-bad record. Segments after a gap are removed (an offset range must stay
dense). A batch whose write did not complete therefore disappears whole.
"""

from gateway.hot.disk.log import DiskHotLog
from gateway.hot.disk.records import (
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    MAGIC,
    STATE_FILE,
    FsyncPolicy,
    segment_name,
)

__all__ = [
    "HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "STATE_FILE",
    "DiskHotLog",
    "FsyncPolicy",
    "segment_name",
]

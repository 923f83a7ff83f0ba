"""A KV event subscriber that decodes kvtierd's messages the way llm-d's indexer decodes
vLLM's (pkg/kvevents/engineadapter/vllm_adapter.go): three frames [topic, sequence as 8
bytes big-endian, msgpack payload]; the payload a positional [ts, [events], dp_rank]; each
event a map with its "type" (vLLM's current form) or a positional array tagged by its first
element (the older form); hashes unsigned 64-bit integers (or bytes, whose last 8 bytes are
read big-endian); the medium lowercased as a device tier.

It collects until --expect BlockStored hashes arrived (or --seconds pass), then until the
socket is quiet for --idle seconds; messages whose sequence is --first plus one in --drop are treated as
lost, and every gap (from the publisher's first sequence, --first, on) is filled from the
replay socket. Prints JSON.

Run with /usr/bin/python3 (Debian's python3-zmq and python3-msgpack).
"""

import argparse
import json
import struct
import sys
import time

import msgpack
import zmq


def as_u64(raw):
    if isinstance(raw, int):
        return raw & 0xFFFFFFFFFFFFFFFF
    if isinstance(raw, (bytes, bytearray)):
        return int.from_bytes(bytes(raw[-8:]).rjust(8, b"\0"), "big")
    raise ValueError(f"unsupported hash type {type(raw)}")


def decode(payload, bad):
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        bad.append("batch not positional")
        return []
    out = []
    for ev in batch[1]:
        if isinstance(ev, dict):  # tagged: the fields in positional order
            fields = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                      "medium", "lora_name"),
                      "BlockRemoved": ("block_hashes", "medium")}.get(ev.get("type"), ())
            ev = [ev.get("type")] + [ev.get(f) for f in fields]
        if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
            bad.append("event neither a map with a type nor a tagged array")
            continue
        tag = ev[0]
        if tag == "BlockStored":
            # tag, hashes, parent, token ids, block size, lora id, medium, lora name
            medium = (ev[6] if len(ev) > 6 and ev[6] is not None else "gpu").lower()
            parent = None if ev[2] is None else as_u64(ev[2])
            out.append({"tag": tag, "hashes": [as_u64(h) for h in ev[1]], "parent": parent,
                        "block_size": ev[4], "medium": medium, "tokens": len(ev[3] or [])})
        elif tag == "BlockRemoved":
            medium = (ev[2] if len(ev) > 2 and ev[2] is not None else "gpu").lower()
            out.append({"tag": tag, "hashes": [as_u64(h) for h in ev[1]], "medium": medium})
        elif tag == "AllBlocksCleared":
            out.append({"tag": tag})
        else:
            bad.append(f"unknown tag {tag}")
    return out


def replay(ctx, endpoint, start, bad):
    """[seq, payload] pairs from `start` on, as vLLM's replay socket sends them."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    deadline = time.time() + 10
    while time.time() < deadline:
        if not s.poll(1000):
            continue
        frames = s.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            bad.append(f"replay frames {len(frames)}")
            break
        seq = struct.unpack(">q", frames[1])[0]
        if seq == -1:
            break
        got.append((seq, frames[2]))
    s.close()
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--first", type=int, default=0, help="the publisher's first sequence (kvctl status --json)")
    ap.add_argument("--drop", default="", help="comma-separated sequences after --first to treat as lost")
    args = ap.parse_args()
    drop = {args.first + int(x) for x in args.drop.split(",") if x}

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(args.endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    print("ready", file=sys.stderr, flush=True)

    bad = []
    messages = {}  # seq -> (topic, events)
    stored = 0
    end = time.time() + args.seconds
    quiet_since = time.time()
    while time.time() < end:
        if not sub.poll(100):
            if stored >= args.expect and time.time() - quiet_since > args.idle:
                break
            continue
        quiet_since = time.time()
        parts = sub.recv_multipart()
        if len(parts) != 3 or len(parts[1]) != 8:
            bad.append(f"frames {len(parts)}")
            continue
        seq = struct.unpack(">Q", parts[1])[0]
        if seq in drop:
            continue
        events = decode(parts[2], bad)
        messages[seq] = (parts[0].decode(), events)
        stored += sum(len(e["hashes"]) for e in events if e["tag"] == "BlockStored")

    live = sorted(messages)
    top = live[-1] if live else -1
    missing = [s for s in range(args.first, top + 1) if s not in messages]
    replayed = 0
    if missing and args.replay:
        for seq, payload in replay(ctx, args.replay, missing[0], bad):
            if seq not in messages:
                replayed += 1
                messages[seq] = ("", decode(payload, bad))
    seqs = sorted(messages)
    gaps = sum(1 for a, b in zip([args.first - 1] + seqs, seqs) if b != a + 1)

    by = {}
    for seq in seqs:
        for e in messages[seq][1]:
            if e["tag"] == "AllBlocksCleared":
                by.setdefault("cleared", 0)
                by["cleared"] += 1
                continue
            key = f"{e['tag']}:{e['medium']}"
            by.setdefault(key, []).extend(e["hashes"])
    json.dump({"topics": sorted({messages[s][0] for s in live}), "live_missing": len(missing),
               "replayed": replayed, "messages": len(seqs), "gaps": gaps, "bad": bad[:5],
               "block_sizes": sorted({e.get("block_size") for s in seqs for e in messages[s][1]
                                      if e["tag"] == "BlockStored"}),
               "token_ids": sum(e.get("tokens", 0) for s in seqs for e in messages[s][1]),
               "events": by}, sys.stdout)


if __name__ == "__main__":
    main()

"""Render a run's results as ``docs/benchmarks.md``: tables, versions, machine, targets and the reading."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any, Optional

from .common import median, ms

__all__ = ["environment", "render", "ms"]

#: Lateness contenders in table order.
ORDER = ("a", "b", "b2", "c", "d", "d2", "e")


def environment() -> dict[str, Any]:
    """Versions and machine facts for the report."""
    import amqp
    import celery
    import kombu

    try:
        rabbit = subprocess.run(["rabbitmqctl", "-q", "version"], capture_output=True, text=True,
                                timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rabbit = "unknown"
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown")
    return {"python": platform.python_version(), "celery": celery.__version__, "kombu": kombu.__version__,
            "amqp": amqp.__version__, "rabbitmq": rabbit, "cores": os.cpu_count(),
            "memory_gb": round(mem_kb / 2**20, 1), "cpu": cpu, "os": platform.platform()}


def _lateness_table(lateness: dict[str, Any], order: tuple[str, ...] = ORDER) -> list[str]:
    rows = ["| contender | arrived | min | p50 | p99 | max | early | late > 50 ms | late > 1 s | hops/msg | "
            "relay CPU/msg |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in order:
        if key not in lateness:
            continue
        c = lateness[key]
        if "error" in c:
            rows.append(f"| {c['name']} | failed: {c['error']} | | | | | | | | | |")
            continue
        s = c["summary"]
        arrived = f"{s['arrived']}/{s['expected']}"
        if s.get("still_waiting_after_s") is not None:
            arrived += f" (still waiting after {s['still_waiting_after_s']} s)"
        hops = f"{s['hops_per_message']:.2f}" if s.get("hops_per_message") is not None else "–"
        cpu = f"{s['relay_cpu_us_per_message']:,.0f} µs" if s.get("relay_cpu_us_per_message") is not None else "–"
        rows.append(f"| {c['name']} | {arrived} | {ms(s['min'])} | {ms(s['p50'])} | {ms(s['p99'])} | "
                    f"{ms(s['max'])} | {s['early']} | {s['late_50ms']} | {s['late_1s']} | {hops} | {cpu} |")
    return rows


def _footprint_table(fp: dict[str, Any]) -> list[str]:
    rows = ["| worker | tasks sent | publish rate | RSS growth | tasks held unacked | plain task sent after them |",
            "|---|---:|---:|---:|---:|---|"]
    for mode in ("vanilla", "ladder"):
        r = fp.get(mode)
        if not r:
            continue
        if "error" in r:
            rows.append(f"| {mode} | failed: {r['error']} | | | | |")
            continue
        plain = (f"ran after {ms(r['plain_wait_ms'])} ms" if r["plain_wait_ms"] is not None
                 else f"**still waiting after {r['still_waiting_after_s']} s**")
        samples = r.get("samples") or []
        if r["plain_wait_ms"] is None and len(samples) >= 2 and samples[-1]["t"] > samples[0]["t"]:
            pace = (samples[-1]["unacked"] - samples[0]["unacked"]) / (samples[-1]["t"] - samples[0]["t"])
            if pace > 0:
                plain += f" (pulling {pace:.1f} tasks/s: all {r['n']:,} after about {r['n'] / pace / 60:,.0f} min)"
        rows.append(f"| {'vanilla Celery' if mode == 'vanilla' else 'Celery with the ladder'} | {r['n']:,} | "
                    f"{r['publish_per_s']:,.0f}/s | {r['rss_growth_kb'] / 1024:+.1f} MB | {r['unacked']:,} | {plain} |")
    return rows


def _relay_table(relay: dict[str, Any]) -> list[str]:
    rows = ["| relay | processes | hops/s (median) | relay CPU per hop (median) | rounds (hops/s) |",
            "|---|---:|---:|---:|---|"]
    ratios = ", ".join(f"{r:.2f}" for r in relay.get("ratio_per_repeat", []))
    names = {"raw": "raw py-amqp loop (pipelined confirms)", "ours": "kombu_ladder.relay.Relay"}
    for key, s in relay["summary"].items():
        kind, processes = key.split("x")
        rates = ", ".join(f"{r:,.0f}" for r in s["rates"])
        cpu = f"{s['cpu_us_per_hop']:.0f} µs" if "cpu_us_per_hop" in s else "–"
        rows.append(f"| {names[kind]} | {processes} | {s['median']:,.0f} | {cpu} | {rates} |")
    rows += ["", f"Ours/raw at one process, per repeat (each pair measured back to back): {ratios}; median "
             f"**{relay['ratio']:.2f}×** (ratio of the medians: {relay.get('ratio_of_medians', relay['ratio']):.2f}×)."]
    cpu = relay.get("cpu_ratio_per_repeat")
    if cpu:
        rows[-1] += (f" CPU per hop, the raw loop's over ours, per repeat: {', '.join(f'{r:.2f}' for r in cpu)}; "
                     f"median **{relay['cpu_ratio']:.2f}×** (1.0× or more: the relay costs no more than the loop).")
    return rows


def _publish_table(pub: dict[str, Any]) -> list[str]:
    from .publish import PAIRS

    per = "msgs per CPU second" if pub.get("measure") == "cpu" else "msgs/s"
    unsent = pub.get("unsent_cpu_us")
    extra = " CPU per publish | of which before sending |" if unsent else ""
    rows = [f"| publish | {per} (median) | rounds | ratio to baseline (median of paired rounds) |{extra}",
            "|---|---:|---|---:|" + ("---:|---:|" if unsent else "")]
    for baseline, contender in PAIRS:
        for label in (baseline, contender):
            rates = ", ".join(f"{r:,.0f}" for r in pub["rates"][label])
            ratio = "1 (baseline)"
            if label == contender:
                paired = ", ".join(f"{r:.2f}" for r in pub.get("paired_ratios", {}).get(label, []))
                ratio = f"**{pub['ratios'][label]:.2f}×** (per round: {paired})"
            cells = (f" {pub['cpu_us'][label]:.1f} µs | {unsent[label]:.1f} µs |" if unsent else "")
            rows.append(f"| `{label}` | {pub['medians'][label]:,.0f} | {rates} | {ratio} |{cells}")
    if unsent:
        rows += ["", "*Before sending*: the same rounds with each channel's `basic_publish` encoding the message's "
                 "properties as py-amqp's frame writer does and sending nothing (no framing, no socket)."]
    return rows


def _scale_table(sc: dict[str, Any]) -> list[str]:
    before, loaded = sc["memory_before"], sc["memory_loaded"]
    mb = 2**20
    return [
        "| measure | value |", "|---|---:|",
        f"| messages waiting in this vhost (1h rung + control queue) | {loaded['vhost_messages']:,} |",
        f"| broker total memory before → loaded (whole shared broker) | {before['broker_total'] / mb:,.0f} MB → "
        f"{loaded['broker_total'] / mb:,.0f} MB (+{(loaded['broker_total'] - before['broker_total']) / mb:,.0f} MB) |",
        f"| message bytes held in RAM by this vhost's queues | {loaded['vhost_message_bytes_ram'] / mb:,.0f} MB |",
        f"| queue process memory of this vhost | {loaded['vhost_queue_memory'] / mb:,.0f} MB |",
        f"| LadderProducer publish rate (countdown=3600 / countdown=1.5) | {sc['publish_rate_waiting']:,.0f}/s / "
        f"{sc['publish_rate_due']:,.0f}/s |",
        f"| relay drain of {sc['due']:,} messages due at once (1 process) | {sc['drain']['count']:,} in "
        f"{sc['drain']['seconds']:.1f} s = **{sc['drain']['rate']:,.0f}/s** |",
    ]


#: How the bursts table names each way of running the relays.
RELAY_KINDS = {"standalone": "`kombu-ladder relay`", "worker": "`celery worker -P ladder`"}


def _per(value: Optional[float], unit: str = "µs") -> str:
    return "–" if value is None else f"{value:,.0f} {unit}"


def _bursts_table(bursts: dict[str, Any]) -> list[str]:
    alone = bursts["broker_only"]
    measured = [f"{a['rate']:,.0f}/s" if a.get("rate") else "not measured" for a in alone]
    reference = bursts.get("broker_only_rate")
    lines = [f"**The broker alone:** {bursts['n']:,} expired {bursts['size']}-byte persistent messages dead-lettered "
             f"from one queue to another at once, no client in the path: {' before the rounds, '.join(measured)} "
             f"after them. " + (f"Their median, **{reference:,.0f}/s**, is 1× below." if reference else
                                "Without it the ratios are left out."), ""]
    raw = bursts.get("raw_loop")
    if raw:
        moved = [f"{r['rate']:,.0f}/s ({_per(r.get('cpu_us'))} of CPU per message)" if r.get("rate")
                 else "not measured" for r in raw]
        lines[-2:-1] = [lines[-2] + f" **A raw py-amqp loop** (consume, republish unchanged with pipelined confirms, "
                        f"ack with `multiple`) moving {bursts['n']:,} such messages, waiting in the control queue, "
                        f"to the same consumer: {' before the rounds, '.join(moved)} after them; × the raw loop "
                        f"divides a round's deliveries per second by their median."]
    with_raw = bool(bursts.get("raw_loop_rate"))
    # Two tables of the same rows: at twelve columns one is wider than the page's text column.
    arrivals = ["**When they arrived** (lateness in ms):", "",
                "| burst | relays | arrived | first | p50 | p99 | last | early |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    pace = ["**At what pace, and at what cost:**", "",
            "| burst | relays | deliveries/s | × the broker alone |" + (" × the raw loop |" if with_raw else "")
            + " relay CPU per delivery | broker CPU per delivery |",
            "|---|---|---:|---:|" + ("---:|" if with_raw else "") + "---:|---:|"]
    for r in bursts["rounds"]:
        who = f"| {r['shape']} | {r['relays']} × {RELAY_KINDS[r['kind']]} |"
        if "error" in r:
            arrivals.append(f"{who} failed: {r['error']} | | | | | |")
            pace.append(f"{who} failed | | | |")
            continue
        ratio = f"**{r['ratio']:.2f}×**" if r.get("ratio") is not None else "–"
        if r.get("kept_up") and r.get("ratio") is not None:
            ratio += " (kept up)"
        rate = f"{r['rate']:,.0f}" if r.get("rate") else "–"
        arrivals.append(f"{who} {r['arrived']:,}/{r['expected']:,} | {ms(r['first'])} | {ms(r['p50'])} | "
                        f"{ms(r['p99'])} | {ms(r['last'])} | {r['early']:,} |")
        versus_raw = (f" {r['raw_ratio']:.2f}× |" if r.get("raw_ratio") is not None else " – |") if with_raw else ""
        pace.append(f"{who} {rate} | {ratio} |{versus_raw} {_per(r.get('relay_cpu_us'))} | "
                    f"{_per(r.get('broker_cpu_us'))} |")
    lines += [*arrivals, "", *pace]
    overran = [r for r in bursts["rounds"] if r.get("publish_to_due_s") is not None and r["publish_to_due_s"] < 11]
    if overran:
        lines += ["", "Publishing ended less than 11 s before the due second in " + ", ".join(
            f"{r['shape']} {r['relays']} × {r['kind']} ({r['publish_to_due_s']:.1f} s)" for r in overran)
            + ": those messages reached the relays inside their hold window, not as a user's would."]
    return lines


def _waiting_table(waiting: dict[str, Any]) -> list[str]:
    runs = waiting["brokers"]
    mb = 2**20
    head = "| measure | " + " | ".join(f"RabbitMQ {r['broker']}" for r in runs) + " |"
    rows = [head, "|---|" + "---:|" * len(runs)]

    def row(label: str, cell: Any) -> None:
        cells = []
        for r in runs:
            try:
                cells.append("failed: " + r["error"] if "error" in r else cell(r))
            except (KeyError, TypeError):
                cells.append("–")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("queue profile", lambda r: r["profile"])
    row("messages waiting in the 1 h rung", lambda r: f"{r['loaded']['vhost_messages']:,}")
    row("node memory: before → with them waiting (the whole node)", lambda r: (
        f"{r['before']['node_memory'] / mb:,.0f} MB → {r['loaded']['node_memory'] / mb:,.0f} MB "
        f"(**{(r['loaded']['node_memory'] - r['before']['node_memory']) / mb:+,.0f} MB**)"))
    row("this vhost's queues: process memory / message bytes in RAM", lambda r: (
        f"{r['loaded']['vhost_queue_memory'] / mb:,.0f} MB / {r['loaded']['vhost_message_bytes_ram'] / mb:,.0f} MB"))
    row("this vhost's message store on disk", lambda r: f"**{r['loaded']['vhost_disk'] / mb:,.0f} MB**")
    row("`LadderProducer.publish` rate (wall clock) / CPU per publish", lambda r: (
        f"{r['publish_per_s']:,.0f}/s / {r['publish_cpu_us']:,.0f} µs"))
    row(f"all due at once: delivered by {waiting['relays']} `kombu-ladder relay`, first arrival to last",
        lambda r: f"{r['arrived']:,} in **{r['drain_s']:,.1f} s** ({r['drain_per_s']:,.0f}/s), {r['early']} early")
    return rows


def _rounds_table(rounds: dict[str, Any]) -> list[str]:
    from .rounds import within

    rows = ["| countdown | placements (theory) | rungs taken | relay hops | lateness | fewest placements of any "
            "plan within +50 ms | met |", "|---:|---:|---|---:|---:|---:|---|"]
    for row in rounds["rows"]:
        rungs = " + ".join(f"{n} × {int(r) // 3600} h" if int(r) >= 3600 else f"{n} × {r} s"
                           for r, n in row["rungs"].items())
        placed, late = within(row)
        met = "met" if placed and late else ("**missed**: " + ("placements" if not placed else "lateness"))
        rows.append(f"| {row['delay_s']:,} s | {row['placements']} ({row['theory']}) | {rungs} | {row['relay_hops']} "
                    f"| {ms(row['lateness_ms'])} ms | {row['fewest_on_time']} | {met} |")
    return rows


def _other_run(other: dict[str, Any]) -> list[str]:
    from .closing import headline
    from .reading import targets

    meta = other["meta"]
    return ["## Another run for comparison", "",
            f"The same harness (`{meta['command']}`, {meta['config']} run) on the same machine, "
            f"{meta['started']} to {meta['finished']} UTC, load at start `{meta['load_start']}` and at end "
            f"`{meta['load_end']}`. It shows how much of the above moves with the machine's load.", "",
            *targets(other["results"]), "", *headline(other["results"]), ""]


def _cancellations_table(data: dict[str, Any]) -> list[str]:
    memory, start, hops = data["memory"], data["start"], data["hops"]
    return [
        "| figure | value |", "|---|---|",
        f"| memory, {memory['n']:,} live cancellations | {memory['mib']} MiB ({memory['bytes_per_id']} bytes each) |",
        f"| relay start, {start['n']:,} records | {start['seconds']} s ({start['records_per_s']:,} records/s) |",
        *_bounded_row(data.get("bounded")),
        *_snapshot_rows(data.get("snapshots")),
        f"| hops/s, none / {hops['live']:,} live | {hops['hops_per_s_none']:,} / {hops['hops_per_s_live']:,} "
        f"(ratio {hops['ratio']}) |",
    ]


def _bounded_row(bounded: Any) -> list[str]:
    """The relay's start after a year of revokes: most records older than what it reads back (a run without it: none)."""
    if not bounded:
        return []
    return [f"| relay start, {bounded['old'] + bounded['live']:,} records ever written, {bounded['live']:,} of them "
            f"within its read-back | {bounded['seconds']} s ({bounded['kept']:,} live kept) |"]


def _snapshot_rows(snapshots: Any) -> list[str]:
    """The relay's start from a snapshot, its reconnect and the read-back start of the same run (none: not run)."""
    if not snapshots or "error" in snapshots:
        return []
    written = (f"{snapshots['records']:,} records written in the last hour, {snapshots['live']:,} live, "
               f"{snapshots['after_snapshot']:,} of them after the newest snapshot")
    return [f"| relay start from a snapshot, {written} | {snapshots['start_s']} s (median of "
            f"{len(snapshots['starts_s'])}: {', '.join(str(s) for s in snapshots['starts_s'])}) |",
            f"| relay reconnect, the same stream | {snapshots['reconnect_s']} s (median of "
            f"{len(snapshots['reconnects_s'])}) |",
            f"| relay start reading the last day back (no snapshot), the same stream | {snapshots['old_start_s']} s "
            f"({snapshots['old_kept']:,} live kept{_gave_up(snapshots['old_start_s'])}) |"]


def _gave_up(seconds: float) -> str:
    """Said of a start that reached the relay's catch-up limit: it relayed then, without the rest."""
    from kombu_ladder.relay.cancelwatch import CATCH_UP_TIMEOUT

    return f"; it stopped reading at its {CATCH_UP_TIMEOUT:g} s limit" if seconds >= CATCH_UP_TIMEOUT else ""


def _index_table(data: dict[str, Any]) -> list[str]:
    publish, relay, scale = data["publish"], data["relay"], data["scale"]
    medians = publish["medians"]
    lines = [
        "| cost (index on ÷ off, median of paired rounds) | off | on | ratio |", "|---|---|---|---|",
        *[f"| {label} publishes per CPU second | {medians[f'{kind} off']:,.0f} | {medians[f'{kind} on']:,.0f} | "
          f"{publish['ratios'][kind]:.2f} |"
          for kind, label in (("kombu", "`LadderProducer.publish(countdown=3600)`"),
                              ("celery", "`apply_async(countdown=3600)`"))],
        f"| relay hops per second, one relay | {median(relay['rates']['off']):,.0f} | "
        f"{median(relay['rates']['on']):,.0f} | {relay['ratio']:.2f} |",
        "",
        f"{scale['n']:,} entries ({scale['cancelled']:,} of them cancelled, {scale['waiting']:,} waiting); "
        f"the SQLite file is {scale['file_mb']} MB.",
        "",
        "| index at scale | median | max |", "|---|---|---|",
        f"| first sync, from nothing | {scale['first_sync_s']} s | |",
        f"| sync with nothing new (what each command pays first) | {scale['again_sync_s'] * 1000:.0f} ms | |",
        *[f"| {name} | {q['median_ms']} ms | {q['max_ms']} ms |" for name, q in scale["queries"].items()],
        *_bulk_rows(scale.get("bulk")),
    ]
    return lines


def _bulk_rows(bulk: Any) -> list[str]:
    """The bulk cancels through the index, each timed once (a run without them: none)."""
    if not bulk:
        return []
    return [f"| bulk cancel by task name ({bulk['task_ids']:,} ids; `waiting cancel --task`) | {bulk['task_s']} s | |",
            f"| the sync that applies them ({bulk['applied']:,} cancellations) | {bulk['apply_sync_s']} s | |",
            f"| bulk cancel of every waiting entry left, by target exchange ({bulk['rest_ids']:,} ids) | "
            f"{bulk['rest_s']} s | |"]


def _web_table(data: dict[str, Any]) -> list[str]:
    look = data["look"]
    return [
        f"{data['n']:,} entries written to the index, and the real messages' own ({data['waiting']:,} waiting in all "
        f"when measured); the console's first read of them took {data['first_sync_s']} s (the server does it once, "
        "in the background).", "",
        "| page (with the query it runs) | median | max | under 1 s |", "|---|---|---|---|",
        *[f"| {name} | {p['median_ms']:,.1f} ms | {p['max_ms']:,.1f} ms | "
          f"{'yes' if p['median_ms'] < 1000 and p['status'] == 200 else 'NO (' + str(p['status']) + ')'} |"
          for name, p in data["pages"].items()],
        "",
        f"The look a message's page starts, for the last of {look['n']:,} real messages in the 1h rung: "
        f"{look['seconds']} s over {look['looked_at']:,} messages ({'found' if look['found'] else 'NOT found'}); "
        "the page is served without waiting for it, and shows its headers and body once it is done.",
    ]


def render(results: dict[str, Any], meta: dict[str, Any], plot: Optional[str],
           other: Optional[dict[str, Any]] = None) -> str:
    """Return the whole Markdown page; ``other`` is a second saved run to compare with (``--also``)."""
    from .bursts import KEPT_UP_MS, lead_s
    from .reading import reading, targets

    env = meta["environment"]
    lines = ["(benchmarks)=", "# Benchmarks", ""]
    if meta["config"] != "full":
        lines += [f"> **This page holds a `{meta['config']}` run** (`make bench-{meta['config']}`), with reduced "
                  "sizes: read its figures as indicative. The full run is `make bench`.", ""]
    lines += [
        "Every comparison below ran on the same broker in the same invocation, each benchmark in a RabbitMQ vhost "
        "of its own. The machine is shared and noisy, so throughput figures are medians over repeats and are "
        "compared as ratios against a baseline measured in the same run.", "",
        f"- **Command:** `{meta['command']}` ({meta['config']} run), {meta['started']} to {meta['finished']} UTC "
        f"({meta['duration_s'] / 60:.1f} min).",
        f"- **Versions:** Python {env['python']}, Celery {env['celery']}, kombu {env['kombu']}, py-amqp {env['amqp']}, "
        f"RabbitMQ {env['rabbitmq']}.",
        f"- **Machine:** {env['cores']} cores ({env['cpu']}), {env['memory_gb']} GB RAM, {env['os']}.",
        f"- **Load:** at start `{meta['load_start']}`; at end `{meta['load_end']}`. Other engineers' test suites "
        "shared the machine and the broker during the run.",
        *[f"- **Re-run:** {', '.join(r['benchmarks'])} at {r['started']} UTC (`{r['load']}`), replacing "
          + "; ".join(f"{k}: {v}" for k, v in r["replaced"].items()) + "." for r in meta.get("reruns", [])],
        "",
        "## Targets", "", *targets(results), "",
        "## 1. Lateness under mixed delays", "",
    ]
    config = meta["sizes"]
    lines += [f"{config['kombu_n']:,} messages (kombu) and {config['celery_n']:,} tasks (Celery) per contender, "
              f"delays uniform in 1–{config['max_delay']:g} s, published in random order. Lateness is arrival "
              "(kombu) or task start (Celery) minus the due time, in milliseconds; negative is early.", ""]
    lateness = results.get("lateness", {})
    if lateness:
        lines += _lateness_table(lateness) + [""]
    burst = lateness.get("burst")
    if burst:
        lines += [f"**Burst.** {config.get('burst_n', 1000):,} messages published together, all due within one "
                  f"second that starts {config.get('burst_lead', 20):g} s after the next whole second: each takes "
                  "two 10 s hops, so the relay takes the whole burst from the rung again as the due second starts, "
                  "holds it, and publishes each message at its due millisecond while the rest still arrive.", "",
                  *_lateness_table({"burst": burst}, ("burst",)), ""]
    if plot:
        lines += [f"![Lateness CDF per contender]({plot})", ""]
    for title, key, table, intro in (
        ("## 2. Worker footprint", "footprint", _footprint_table,
         f"{config['footprint_n']:,} tasks with `countdown=3600`, then one plain task; the wait for it is bounded "
         f"at {config['footprint_wait']:g} s. RSS is the worker's main process (where ETA tasks are held)."),
        ("## 3. Relay throughput", "relay", _relay_table,
         f"{config['relay_n']:,} expired 600-byte persistent messages (due in 2 h, so each becomes one hop into the "
         "1h rung) wait in the control queue; the relay starts and hops them. Prefetch 50 for both relays; the raw "
         "loop republishes each message unchanged with pipelined confirms and acks with `multiple=True`. Targets: "
         "the relay at ≥ 1.0× the raw loop in hops/s and in CPU per hop (the loop's CPU over ours), each the median "
         "of the ratios of paired rounds (a raw round, then ours, back to back)."),
        ("## 4. Publish overhead", "publish", _publish_table,
         f"{config['publish_n']:,} 600-byte persistent publishes per round, rounds alternating; no consumer. Rates "
         "are per second of the publishing process's CPU time (user and system), which the target is about."),
        ("## 5. Scale", "scale", _scale_table,
         f"{config['scale_waiting']:,} messages with `countdown=3600` wait in the 1h rung and {config['scale_due']:,} "
         "with `countdown=1.5` expire into the control queue while no relay runs; then one relay drains them, all "
         "due at once. Queues are classic and not lazy (the contract's exact arguments, no policy)."),
        ("## 6. Cancellations", "cancellations", _cancellations_table,
         "Memory of the pure live set (36-character ids); a relay's start with that many records in "
         "`ladder.cancellations` (until it consumes the control queue), all of them within what a relay reads "
         "back, and then with most of them older than that (the relay's clock set ahead past them, as a relay "
         "starting a day later would be); a relay's start from a snapshot with 1,000,000 records written in the "
         "last hour while a relay ran (10,000 live, the rest for messages due days ago), at the worst moment "
         "between two snapshots, its reconnect, and the start reading the last day back on the same stream; "
         "hop throughput with 100,000 live "
         "cancellations (none matching) against none, in two vhosts measured in turn, medians of 5 rounds."),
        ("## 7. Round delays with a lagging broker", "rounds", _rounds_table,
         "One `LadderProducer.publish(countdown=)` per round delay on the simulator (no broker, virtual time), "
         "every rung expiring 3 ms after its TTL (RabbitMQ's median is 2.5 ms), with our relay and its 10 s hold "
         "window. Theory is `hops_for(countdown)`, a broker without lag. The last column searches every plan "
         "(any rungs, any order): the fewest placements that arrive no later than 50 ms after the due time."),
        ("## 8. Bursts", "bursts", _bursts_table,
         f"{config.get('bursts_n', 10_000):,} messages per round (200-byte persistent bodies), published with "
         f"`LadderProducer.publish` while the relays run, all due within one second that starts "
         f"{lead_s(config.get('bursts_n', 10_000)):g} s after publishing begins: *distinct* messages each at "
         "a random millisecond of it, *identical* ones byte for byte the same message (body, headers, due time). "
         "The relays, started afresh for each round, are standalone `kombu-ladder relay` processes or Celery "
         "workers started with `-P ladder` (`-c 1`, their relay bootstep). A consumer in a process of its own "
         "stamps each arrival; lateness is arrival minus due, in milliseconds: *first* the earliest, *last* the "
         "latest, negative is early. Deliveries per second are arrivals over the time from the first to the "
         "last; *× the broker alone* divides them by the broker's own dead-letter rate, measured in the same run "
         f"on the same node. *Kept up*: every message arrived within {KEPT_UP_MS:g} ms of its due time, so the "
         "rate is the due times' pace (distinct ones span a second), not what the relays could do. CPU is user "
         "and system time over the whole round (hops included) per delivered "
         "message; the broker's is the whole node's, shared with whatever else it served."),
        ("## 9. A million waiting on one node", "waiting", _waiting_table,
         f"{config.get('waiting_n', 100_000):,} 200-byte messages published with `LadderProducer.publish`, all due "
         "at the same moment and waiting in the 1 h rung, on each RabbitMQ release at hand (the shared node, and "
         "the other major `.ci/rabbitmq-alt` runs), each with the queue profile the operations page documents "
         "for it: the `ladder-lazy` policy on 3.11 and older, classic queues (v2) as they are from 3.12 on. Then "
         "they all fall due at once (a `max-length: 0` policy makes the rung dead-letter its whole contents "
         "into the control queue, as its TTL does) and standalone relays deliver them to a consumer. Node "
         "memory is the whole node's (`rabbitmqctl status`), shared with whatever else it served; the vhost "
         "figures are this benchmark's alone."),
        ("## 10. The index of waiting work", "index", _index_table,
         f"Publish cost: {config['publish_n']:,} publishes per round, `index=False` and `index=True` (kombu), "
         "`ladder_index` off and on (Celery), rounds alternating; rates per CPU second of the publishing process. "
         f"Relay cost: {config['relay_n']:,} expired messages hopped by one relay while a producer schedules "
         "others with the index off, then on (the relay itself does no index work). Scale: "
         f"{config.get('index_n', 100_000):,} entries written straight to `ladder.index` in records of 200 (ten "
         "task names, twenty target queues, due times over a week), a cancellation for one in a hundred, then "
         "synced into a new SQLite file and queried: `find` by task id, a page of 50 at offset 1,000, the counts. "
         "Query times are medians of 50 (counts: of 5). Then the bulk cancels of `waiting cancel` (the index's "
         "query, then the batch records, confirmed), each timed once: one task name's waiting entries, the sync "
         "that applies them, then every waiting entry left."),
        ("## 11. The web console", "web", _web_table,
         f"{config.get('web_n', 100_000):,} entries written straight to `ladder.index` as in section 10, and "
         f"{config.get('web_look_n', 10_000):,} real messages scheduled an hour or more ahead; a console "
         "(`kombu_ladder.web`) over that vhost, driven in-process by Starlette's TestClient: each page requested "
         "7 times after a warm-up, the whole request timed (routing, index queries, rendering)."),
    ):
        lines += [title, "", intro, ""]
        data = results.get(key)
        if data is None:
            lines += ["Not run.", ""]
        elif "error" in data and key not in ("footprint",):
            lines += [f"Failed: `{data['error']}`", ""]
        else:
            lines += table(data) + [""]
    from .closing import closing
    from .index_store import page_section

    lines += page_section()
    lines += ["## Reading", "", *reading(results), "", "## Closing note", "", *closing(results), ""]
    if other:
        lines += _other_run(other)
    return "\n".join(lines)

"""The closing note: the headline table again, and for each missed target why, and what would close it."""

from __future__ import annotations

from typing import Any, Optional

from .common import ms

__all__ = ["closing", "headline"]

def _s(results: dict[str, Any], key: str) -> Optional[dict[str, Any]]:
    c = results.get("lateness", {}).get(key)
    return c["summary"] if c and "summary" in c else None


def headline(results: dict[str, Any]) -> list[str]:
    """The headline lateness table, compact."""
    rows = ["| contender | p50 | p99 | max | early | late > 1 s |", "|---|---:|---:|---:|---:|---:|"]
    for key in ("a", "b", "c", "d", "e"):
        c = results.get("lateness", {}).get(key)
        if c and "summary" in c:
            s = c["summary"]
            rows.append(f"| {c['name']} | {ms(s['p50'])} | {ms(s['p99'])} | {ms(s['max'])} | "
                        f"{s['early']}/{s['arrived']} | {s['late_1s']} |")
    return rows


def _relay_cpu(results: dict[str, Any]) -> str:
    relay = results.get("relay") or {}
    summary = relay.get("summary", {})
    ours, raw = summary.get("oursx1", {}), summary.get("rawx1", {})
    if "cpu_us_per_hop" in ours and "cpu_us_per_hop" in raw:
        return (f" Our relay spent {ours['cpu_us_per_hop']:.0f} µs of CPU per hop against the raw loop's "
                f"{raw['cpu_us_per_hop']:.0f} µs; both spend most of it in py-amqp's framing and (de)serialization.")
    return ""


def _burst(results: dict[str, Any]) -> list[str]:
    burst = _s(results, "burst")
    if not burst or (burst["p99"] is not None and burst["p99"] <= 50 and burst["arrived"] == burst["expected"]):
        return []
    return [f"- **Missed: burst p99 ≤ 50 ms** (p99 {ms(burst['p99'])} ms, max {ms(burst['max'])} ms, "
            f"{burst['arrived']:,} of {burst['expected']:,} arrived). Why: the relay publishes each held message "
            f"at its due time, but the burst "
            f"comes back from the 10 s rung as its due second starts, so the broker dead-letters the whole burst "
            f"to the relay, takes its acks and routes the first deliveries at once, on two cores it shares with "
            f"the relay, the producer and the consumer; deliveries wait in the broker meanwhile. "
            f"What would close it: broker CPU (a core the clients do not share); the relay is not the bound."]


def _publish(pub: dict[str, Any]) -> list[str]:
    from .publish import PAIRS

    out = []
    for baseline, contender in PAIRS:
        ratio = pub["ratios"].get(contender)
        if ratio is None or ratio >= 0.9:
            continue
        paired = ", ".join(f"{r:.2f}" for r in pub.get("paired_ratios", {}).get(contender, []))
        line = f"- **Missed: `{contender}` ≥ 0.9×** ({ratio:.2f}×, per round {paired}) in CPU time per publish."
        total, unsent = pub.get("cpu_us"), pub.get("unsent_cpu_us")
        if total and unsent:
            before = unsent[baseline] / unsent[contender]
            line += (f" What bounds it, measured in this run: {total[contender]:.1f} µs per publish against "
                     f"{total[baseline]:.1f} µs for `{baseline}`; before sending (the properties encoded, nothing "
                     f"framed or sent) {unsent[contender]:.1f} µs against {unsent[baseline]:.1f} µs "
                     f"({before:.2f}×).")
            if unsent[baseline] >= total[baseline] or unsent[contender] >= total[contender]:
                line += (" The rounds without sending came out as costly as the whole publish, so on this machine "
                         "they swing by more than sending costs and the run cannot split the two. What would "
                         "close it: a quiet machine for the measurement.")
            elif before >= 0.9:
                line += (" Before sending the ladder is within the target: what is left is sending a larger "
                         "message (the four `x-schedule-*` headers and `type`) and rounds that swing with the "
                         "machine's load. What would close it: a quiet machine for the measurement.")
            else:
                line += (" The ladder's own work before sending is the bound: it validates the countdown or eta, "
                         "places the message in a rung and encodes the four `x-schedule-*` headers and `type` "
                         "with the publisher's own (Celery's path also reads the ladder settings and the task's "
                         "`eta` back from its header, and counts the task). What would close it: less of that "
                         "work per publish.")
        out.append(line)
    return out


def _cpu(r: dict[str, Any]) -> str:
    relay = f"{r['relay_cpu_us']:,.0f} µs" if r.get("relay_cpu_us") is not None else "not measured"
    broker = f"{r['broker_cpu_us']:,.0f} µs" if r.get("broker_cpu_us") is not None else "not measured"
    return f"the relays' CPU per delivered message (hops included) was {relay} and the broker's {broker}"


def _bursts(results: dict[str, Any]) -> list[str]:
    from .reading import burst_round, burst_rounds, twin_ratios

    bursts = results.get("bursts") or {}
    rounds = burst_rounds(bursts)
    out = []
    early = [r for r in rounds if r["early"]]
    if early:
        out.append(
            "- **Missed: bursts, none early** (" + "; ".join(
                f"{r['shape']} {r['relays']} × {r['kind']}: {r['early']:,} early, the first {ms(r['first'])} ms"
                for r in early) + "). Why: a relay holds a message whose remaining delay is under its hold "
            "window only while it has room to hold it; beyond that it puts the message back through the 1 s "
            "rung, which delivers up to a second early. What would close it: leaving what cannot be held where "
            "it costs nothing (unacked in the control queue, or in a rung) until it is due.")
    for r in rounds:
        if r["relays"] != 1 or r["shape"] != "distinct" or r.get("ratio") is None or r["ratio"] >= 0.3 \
                or r.get("kept_up"):
            continue
        more = [burst_round(rounds, "distinct", r["kind"], k) for k in (2, 4)]
        scaling = ", ".join(f"{m['relays']} relays {m['ratio']:.2f}×" for m in more if m and m.get("ratio"))
        out.append(
            f"- **Missed: one {r['kind']} relay ≥ 0.3× the broker alone** ({r['ratio']:.2f}×: {r['rate']:,.0f} "
            f"deliveries/s against the broker's {bursts['broker_only_rate']:,.0f}/s; {scaling}). What bounds "
            f"it, measured in this round: {_cpu(r)}. At that CPU per delivery one relay process on a core of its "
            f"own would deliver at most about {1e6 / r['relay_cpu_us']:,.0f}/s; on two cores shared with the "
            f"broker, the producer and the consumer it gets less. What would close it: less relay CPU per "
            f"delivery, or more relays until the broker is the limit.")
    for who, ratio in twin_ratios(rounds):
        if ratio >= 0.9:
            continue
        relays, kind = who.split(" × ")
        twin = burst_round(rounds, "identical", kind, int(relays))
        single = burst_round(rounds, "distinct", kind, int(relays))
        if twin is None or single is None:
            continue
        lighter = (twin.get("relay_cpu_us") is not None and single.get("relay_cpu_us") is not None
                   and twin["relay_cpu_us"] <= single["relay_cpu_us"])
        out.append(
            f"- **Missed: identical messages ≥ 0.9× as fast as distinct ones** ({who}: {ratio:.2f}×, "
            f"{twin['rate']:,.0f}/s against {single['rate']:,.0f}/s). Measured: with identical messages "
            f"{_cpu(twin)}; with distinct ones {_cpu(single)}. " + (
                "The relays did no more work per identical message, so the gap is not theirs: rounds a few "
                "minutes apart on this loaded machine swing by as much (the other relay counts' ratios, above). "
                "What would close it: repeated rounds on a quiet machine." if lighter else
                "The relays spent more CPU per identical message than per distinct one. What would close it: "
                "a relay that handles a twin as it handles any other message."))
    return out


def _rounds(results: dict[str, Any]) -> list[str]:
    from kombu_ladder.plan import tolerance_ms

    from .rounds import LATEST_MS, within

    rounds = results.get("rounds")
    if not rounds or "error" in rounds:
        return []
    out = []
    for row in rounds["rows"]:
        placed, late = within(row)
        if placed and late:
            continue
        what = ("placements" if not placed else "lateness") + f" for countdown={row['delay_s']:,}"
        out.append(
            f"- **Missed: round delays, {what}** ({row['placements']} placements against {row['theory']} in theory, "
            f"{ms(row['lateness_ms'])} ms late). Why: every rung expires {rounds['lag_ms']} ms late, so "
            f"{row['placements']} consecutive hops gather {row['placements'] * rounds['lag_ms']} ms, and the hold "
            f"window can only absorb a message that is early. No plan does better within the placements: searching "
            f"every plan (any rungs, any order), the fewest placements that arrive no more than {LATEST_MS} ms late "
            f"are {row['fewest_on_time']}. The contract forbids a per-message `expiration` in a rung, which is what "
            f"would trim a hop by the lag. The relay keeps the theoretical placements and arrives within its last "
            f"rung's tolerance ({tolerance_ms(3600)} ms for the 1 h rung); when a message's gathered lag "
            f"outgrows that tolerance it steps down a rung and is held to its due time (docs/how.rst, "
            f"\"How late, at most\"). What would close it: a broker that expires on time, or lowering "
            f"`kombu_ladder.plan.TOLERANCE_PPM`, which trades those ms for {row['fewest_on_time']} placements.")
    return out


def closing(results: dict[str, Any]) -> list[str]:
    """Markdown lines of the closing note."""
    out = ["The headline, lateness in ms under mixed delays (section 1):", "", *headline(results), ""]
    first = len(out)
    b, b2, c, d, d2, e = (_s(results, k) for k in ("b", "b2", "c", "d", "d2", "e"))
    if b and (b["late_50ms"] or b["arrived"] < b["expected"] or (b["p99"] is not None and b["p99"] > 20)):
        extra = ""
        peak = f" (peak {b['max_backlog']:,} waiting in the control queue)" if b.get("max_backlog") else ""
        if b2:
            extra = (f" With two relay processes {b2['late_50ms']} were (max {ms(b2['max'])} ms).")
        out.append(
            f"- **Missed: (b) p99 ≤ 20 ms and max ≤ 50 ms** (p99 {ms(b['p99'])} ms, max {ms(b['max'])} ms, "
            f"{b['late_50ms']} late by more than 50 ms). Why: not the hold timer, which publishes a held message "
            f"at its due time, nor the rungs' TTLs; the tail is "
            f"the broker and the clients scheduled late on two shared cores while rungs release what was "
            f"published together{peak}.{extra}{_relay_cpu(results)} What would close it: a quieter host, or cores "
            f"not shared with the broker.")
    if d and d["p99"] is not None and d["p99"] > 20:
        others = ""
        if c and e:
            others = (f" Vanilla's p99 was {ms(c['p99'])} ms and native delayed delivery's {ms(e['p99'])} ms "
                      f"in the same run.")
        if d2:
            others += f" With the relay outside the worker (d2) it was {ms(d2['p99'])} ms."
        out.append(
            f"- **Missed: (d) p99 ≤ 20 ms** (p99 {ms(d['p99'])} ms; no task started early).{others} Why: every "
            f"Celery contender starts a task from the worker's own ETA timer, and on this shared two-core machine "
            f"the worker's processes are scheduled late in the tail. What would close it: a host that is not "
            f"running other suites; nothing in the ladder's path sets this tail, since the task reaches the worker "
            f"before its ETA and waits there.")
    relay = results.get("relay")
    if relay and "error" not in relay and relay["ratio"] < 1.0:
        out.append(
            f"- **Missed: relay ≥ 1.0× the raw loop** ({relay['ratio']:.2f}×, per repeat "
            f"{', '.join(f'{r:.2f}' for r in relay['ratio_per_repeat'])}).{_relay_cpu(results)} Why: the rounds "
            f"swing with the machine's load by more than the relays differ. What would close it: a quiet machine "
            f"for the measurement; the CPU per hop shows the intrinsic gap.")
    pub = results.get("publish")
    if pub and "error" not in pub:
        out += _publish(pub)
    out += _burst(results) + _bursts(results) + _rounds(results)
    fp = results.get("footprint", {}).get("ladder")
    if fp and "error" not in fp and (fp["rss_growth_kb"] > 5 * 1024 or fp["unacked"] > 50
                                     or fp["plain_wait_ms"] is None or fp["plain_wait_ms"] > 1000):
        out.append("- **Missed: the footprint target with the ladder**; see section 2 for the figures.")
    if len(out) == first:
        out.append("- Every target was met in this run.")
    return out

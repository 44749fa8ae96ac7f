"""Pure tests of the relay's confirm bookkeeping (kombu_ladder.relay.pending): no broker."""

from __future__ import annotations

from dataclasses import dataclass

from kombu_ladder.relay.pending import Entry, Pending


@dataclass
class Source:
    delivery_tag: int


def deliver(tag: int, body: object = b"x", routing_key: str = "q") -> Entry:
    return Entry(Source(tag), "deliver", "", routing_key, body)


def test_release_acks_the_longest_confirmed_prefix_only() -> None:
    pending = Pending()
    for tag in (1, 2, 3):
        pending.add(deliver(tag))
    pending.confirm(2, multiple=False)
    assert pending.release() == ([], None), "seq 1 is unconfirmed: nothing may be acked"
    pending.confirm(1, multiple=False)
    released, last = pending.release()
    assert [e.source.delivery_tag for e in released] == [1, 2]
    assert last == Source(2)
    assert len(pending) == 1


def test_multiple_ack_covers_every_unconfirmed_entry_up_to_the_tag() -> None:
    pending = Pending()
    for tag in (1, 2, 3):
        pending.add(deliver(tag))
    pending.confirm(2, multiple=True)
    released, last = pending.release()
    assert last == Source(2) and len(released) == 2


def test_a_multiple_nack_does_not_cover_entries_already_confirmed() -> None:
    pending = Pending()
    first = pending.add(deliver(1))
    pending.get(first).waiting_on = pending.next_seq  # type: ignore[union-attr]
    replacement = pending.add(Entry(None, "park", "", "parked", None, parent=first))
    later = pending.add(deliver(2))
    pending.confirm(first, multiple=False)
    pending.confirm(replacement, multiple=False)
    assert pending.seqs(later, multiple=True) == [later]


def test_an_entry_waits_for_its_whole_chain_of_replacements() -> None:
    pending = Pending()
    first = pending.add(deliver(1))
    pending.get(first).waiting_on = pending.next_seq  # type: ignore[union-attr]
    retry = pending.add(Entry(None, "hop", "acemq.schedule", "acemq.schedule.1s", b"x", parent=first))
    pending.get(retry).waiting_on = pending.next_seq  # type: ignore[union-attr]
    park = pending.add(Entry(None, "park", "", "parked", None, parent=retry))
    pending.confirm(first, multiple=False)
    pending.confirm(retry, multiple=False)
    assert pending.release() == ([], None), "the park replacing the retry is not confirmed yet"
    pending.confirm(park, multiple=False)
    released, last = pending.release()
    assert last == Source(1) and [e.kind for e in released] == ["deliver", "hop", "park"]


def test_settled_entries_are_released_without_being_counted_or_acked() -> None:
    pending = Pending()
    seq = pending.add(deliver(1))
    entry = pending.get(seq)
    assert entry is not None
    entry.confirmed = entry.settled = True
    assert pending.release() == ([], None)
    assert len(pending) == 0


def test_a_return_matches_the_oldest_unconfirmed_delivery_with_its_body_as_bytes_or_text() -> None:
    pending = Pending()
    pending.add(deliver(1, body=b"other"))
    second = pending.add(deliver(2, body='{"n": 1}'))
    pending.add(deliver(3, body='{"n": 1}'))
    found = pending.match_return("", "q", b'{"n": 1}')
    assert found is not None and found[0] == second
    assert pending.match_return("", "elsewhere", b'{"n": 1}') is None


def test_reset_numbers_confirms_from_one_again() -> None:
    pending = Pending()
    pending.add(deliver(1))
    pending.reset()
    assert len(pending) == 0 and pending.next_seq == 1

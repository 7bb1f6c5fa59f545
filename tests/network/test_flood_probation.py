"""An address whose connection was ended for flooding: remembered for a while
(network/flooders.py), and its next connections parsed at an eighth of the pace until they
have earned their streams (http2_base.PROBATION_FRAMES)."""

from __future__ import annotations

import asyncio

import pytest

from tensorgate.network import ConnectionBudget, http2, http2_base
from tensorgate.network.flooders import FloodedAddresses, address_key
from tests.network.test_http2_streams import (_feed, _opened_by_turn, _request_block,
                                              _streams, _turning, _until_closed)


@pytest.mark.parametrize("peer, key", [
    (("10.1.2.3", 5000), "10.1.2.3"),
    (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
    (("2001:db8:1:2:bbbb:cccc:dddd:eeee", 1, 0, 0), "2001:db8:1:2::/64"),
    (("2001:db8:1:3::1", 5000, 0, 0), "2001:db8:1:3::/64"),
    (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),
    (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
    ("", None),  # a Unix socket
    (None, None),
    (("not an address", 1), "not an address"),
])
def test_a_client_is_known_by_its_host_or_its_ipv6_64(peer: object, key: str | None) -> None:
    assert address_key(peer) == key


def test_an_address_is_suspect_for_its_period_then_forgotten() -> None:
    now = [100.0]
    addresses = FloodedAddresses(period_s=60.0, clock=lambda: now[0])
    addresses.flooded("10.0.0.9")
    assert addresses.suspect("10.0.0.9") and not addresses.suspect("10.0.0.8")
    assert not addresses.suspect(None)
    now[0] += 59.0
    addresses.flooded("10.0.0.8")
    assert addresses.suspect("10.0.0.9") and len(addresses) == 2
    now[0] += 1.0
    assert not addresses.suspect("10.0.0.9") and addresses.suspect("10.0.0.8")
    assert len(addresses) == 1
    addresses.flooded("10.0.0.8")  # again: its period starts again
    now[0] += 59.5
    assert addresses.suspect("10.0.0.8")
    now[0] += 0.5
    assert len(addresses) == 0 and not addresses.suspect("10.0.0.8")


def test_past_its_capacity_the_longest_quiet_address_is_forgotten_first() -> None:
    now = [0.0]
    addresses = FloodedAddresses(capacity=3, clock=lambda: now[0])
    for number in range(3):
        addresses.flooded(f"10.0.0.{number}")
        now[0] += 1.0
    addresses.flooded("10.0.0.0")  # flooded again: now the latest
    addresses.flooded("10.0.0.3")
    assert len(addresses) == 3
    assert [addresses.suspect(f"10.0.0.{n}") for n in range(4)] == [True, False, True, True]
    addresses.flooded(None)  # no address (a Unix socket): nothing remembered
    assert len(addresses) == 3


def test_with_no_period_nothing_is_remembered() -> None:
    addresses = FloodedAddresses(period_s=0.0)
    addresses.flooded("10.0.0.9")
    assert not addresses.suspect("10.0.0.9") and len(addresses) == 0


async def _flood_until_closed(budget: ConnectionBudget, peer: tuple[str, int]) -> None:
    connection, transport, _, encoder = _turning(budget=budget, peer=peer)
    _feed_streams(connection, 1, 1300, _request_block(encoder))
    await _until_closed(transport, 2000)
    assert transport.closed


def _feed_streams(connection: http2.Http2Connection, first: int, count: int, block: bytes,
                  answered: bool = False) -> None:
    """`count` new streams from `first`: each request whole (`answered`) or reset at once."""
    _feed(connection, _streams(first, count, block, end=answered, reset=not answered))


def test_a_connection_from_an_address_that_flooded_opens_one_stream_a_turn() -> None:
    """Rapid reset from 10.0.0.9 until the connection is ended: the next from 10.0.0.9 opens
    one new stream a turn of the loop (against 8; its turns keep coming though one stream
    spends the turn at once), counted; one from 10.0.0.8 opens 8 a turn."""
    budget = ConnectionBudget()

    async def scenario() -> None:
        await _flood_until_closed(budget, ("10.0.0.9", 40000))
        assert budget.floods == 1 and budget.probation == 0
        for peer, most in ((("10.0.0.9", 40001), 1), (("10.0.0.8", 40002), 8)):
            connection, transport, opened, encoder = _turning(budget=budget, peer=peer)
            assert connection.address == peer[0]
            _feed_streams(connection, 1, 300, _request_block(encoder))
            steps = [len(opened), *await _opened_by_turn(transport, opened, turns=400)]
            assert max(steps) == most and sum(steps) == 300, (peer, steps)
            assert transport.reading and not transport.closed

    asyncio.run(scenario())
    assert budget.probation == 1


def test_probation_ends_once_the_connection_has_earned_its_streams() -> None:
    """On probation, a connection earns its streams a turn as others do, within an eighth
    of their frames (56 answered: 8 a turn, against 61 from an address that did not flood;
    119: 15 against 114, each stream its HEADERS' 8 frames and its RST_STREAM's 1); once it
    has earned 120 (where every connection is at its full pace) it is at the others' pace."""
    async def most_a_turn(answered: int, peer: tuple[str, int]) -> int:
        budget = ConnectionBudget()
        await _flood_until_closed(budget, ("10.0.0.9", 40000))
        connection, transport, opened, encoder = _turning(finish=True, budget=budget,
                                                          peer=peer)
        block = _request_block(encoder)
        _feed_streams(connection, 1, answered, block, answered=True)
        await _opened_by_turn(transport, opened, turns=400)
        assert connection._finished == answered and transport.reading
        before = len(opened)
        _feed_streams(connection, 1 + 2 * answered, 300, block)
        steps = [len(opened) - before, *await _opened_by_turn(transport, opened, turns=400)]
        assert sum(steps) == 300 and transport.reading, (answered, steps)
        assert budget.probation == (peer[0] == "10.0.0.9")
        return max(steps[1:-1])

    assert http2_base.PROBATION_EARNED == 120
    seen = {answered: [asyncio.run(most_a_turn(answered, (host, 40001)))
                       for host in ("10.0.0.9", "10.0.0.8")] for answered in (56, 119, 120)}
    assert seen == {56: [8, 61], 119: [15, 114], 120: [114, 114]}, seen


def test_the_connections_open_from_such_an_address_share_one_pace() -> None:
    """Four connections from an address that flooded, each with 100 streams to open: one
    new stream a turn among them, each its share (one each four turns, what a stream spends
    past a share owed at the next); two closed, the other two one each two turns; all
    closed, the address holds no probation. Four from another address: 8 a turn each."""
    budget = ConnectionBudget()

    async def opened_in(turns: int, connections: list) -> list[int]:
        before = [len(opened) for _, _, opened, _ in connections]
        for _ in range(turns):
            await asyncio.sleep(0)
        return [len(opened) - was for (_, _, opened, _), was in zip(connections, before)]

    async def scenario() -> None:
        await _flood_until_closed(budget, ("10.0.0.9", 40000))
        suspects = [_turning(budget=budget, peer=("10.0.0.9", 40001 + n)) for n in range(4)]
        others = [_turning(budget=budget, peer=("10.0.0.8", 40001 + n)) for n in range(4)]
        assert budget.probation == 4
        for connection, _, _, encoder in suspects + others:
            _feed_streams(connection, 1, 100 if connection.address == "10.0.0.9" else 300,
                          _request_block(encoder))
        await opened_in(4, suspects)  # (the first turn: a stream each, as it was read)
        counts = await opened_in(8, suspects + others)
        assert 7 <= sum(counts[:4]) <= 9 and counts[4:] == [64] * 4, counts
        suspected = await opened_in(40, suspects)
        assert all(9 <= count <= 11 for count in suspected), suspected
        for connection, *_ in suspects[:2]:
            connection.connection_lost(None)
        halved = await opened_in(40, suspects[2:])
        assert all(19 <= count <= 21 for count in halved), halved
        for connection, *_ in suspects[2:]:
            connection.connection_lost(None)
        assert budget.flooders._probations == {}

    asyncio.run(scenario())


def test_with_probation_off_a_flooding_address_opens_as_any_other() -> None:
    """--grpc-flood-probation-s 0 (every client behind one proxy that bounds floods itself):
    the flood is still ended, and counted, but its address is not remembered."""
    budget = ConnectionBudget(probation_s=0)

    async def scenario() -> None:
        await _flood_until_closed(budget, ("10.0.0.9", 40000))
        connection, transport, opened, encoder = _turning(budget=budget,
                                                          peer=("10.0.0.9", 40001))
        _feed_streams(connection, 1, 100, _request_block(encoder))
        steps = [len(opened), *await _opened_by_turn(transport, opened, turns=400)]
        assert max(steps) == 8 and sum(steps) == 100, steps

    asyncio.run(scenario())
    assert budget.floods == 1 and budget.probation == 0 and len(budget.flooders) == 0

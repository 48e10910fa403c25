from tests.tui.helpers import open_app, run_async, wait_until, wait_row


@run_async
async def test_widening_the_terminal_brings_the_side_panel(procs, scenario):
    victim = procs.sleeper("victimproc")
    app = open_app(scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}]))
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_row(pilot, f"gpu0/{victim.pid}")
        side = app.query_one("#side")
        assert not side.display
        await pilot.resize_terminal(160, 45)
        assert await wait_until(pilot, lambda: side.display, timeout=3)
        await pilot.resize_terminal(80, 24)
        assert await wait_until(pilot, lambda: not side.display, timeout=3)

"""Fixtures shared by unit test modules."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture
async def black_hole():
    """An API server address that accepts connections and never answers."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # until the client gives up and closes
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.close()

"""Start a batch that `casebatch batch prepare` wrote, from Temporal's Python SDK.

    casebatch batch prepare --manifest M --output-dir D > request.json
    python3 examples/start_from_python.py ADDRESS request.json

The request holds everything `batch run` would send: the run so started is a normal batch
(`batch status`, `drain`, `resume` and `report` work on it). Prints the run id and the
batch's first status (the workflow's `status` query) as one JSON object.
"""

import asyncio
import json
import os
import sys
import traceback

from temporalio.client import Client
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)


def search_attributes(values):
    """The request's first values, typed as the namespace registers them."""
    pairs = []
    for name, value in values.items():
        if isinstance(value, int):
            pairs.append(SearchAttributePair(SearchAttributeKey.for_int(name), value))
        else:
            pairs.append(SearchAttributePair(SearchAttributeKey.for_keyword(name), value))
    return TypedSearchAttributes(pairs)


async def main(address, request_path):
    with open(request_path) as f:
        request = json.load(f)
    client = await Client.connect(address, namespace=request["namespace"])
    handle = await client.start_workflow(
        request["workflow_type"],
        request["input"],
        id=request["workflow_id"],
        task_queue=request["task_queue"],
        memo=request["memo"],
        search_attributes=search_attributes(request["search_attributes"]),
        # A running batch is never started twice (`batch prepare` refuses one, too).
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
    status = await handle.query("status")
    print(json.dumps({"run_id": handle.result_run_id, "status": status}))


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
        code = 0
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # The SDK's Rust threads can outlive the event loop and abort the interpreter's teardown
    # ("PyGILState_Release: thread state ... must be current", temporalio/sdk-python#300), which
    # would turn a start that succeeded into a crash: leave without the teardown.
    os._exit(code)

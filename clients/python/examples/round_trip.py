"""Create, get, patch with the create's ETag (no GET), pause, list by label
through three pages, cancel: python round_trip.py [URL] [TOPIC]."""

import sys
import uuid
from datetime import UTC, datetime, timedelta

from bucket_scheduler_client import Client

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
topic = sys.argv[2] if len(sys.argv) > 2 else "payments"
with Client(url) as c:
    run, when = uuid.uuid4().hex, datetime.now(UTC) + timedelta(hours=1)
    s = c.create(topic=topic, execute_at=when, payload={"order": 42}, labels={"run": run})
    assert c.get(s.id).version == 1 and s.etag == '"1"'
    s = c.pause(c.patch(s, payload={"order": 43}))  # If-Match: the create's ETag
    for n in range(5):
        c.create(topic=topic, execute_at=when, payload=n, labels={"run": run})
    pages = [len(page.schedules) for page in c.pages(label=f"run={run}", limit=2)]
    listed = [x.id for x in c.list(label=f"run={run}", limit=2)]
    cancelled = c.cancel(s)
    print(pages, len(listed), s.version, s.status, cancelled.status)

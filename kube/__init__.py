"""The Kubernetes plumbing every tidepool process uses: clients and the credentials they carry
(clients.py), reads and writes with tidepool's field manager, Events and conditions (objects.py), the one
status writer (status.py), the informer (informer.py), the watchers' key memory (keys.py), the home capacity aggregate's feed
(capacity.py), tidepool's Prometheus series (metrics.py) and process lifetime (process.py). No Temporal workflow code and no decision lives here:
decisions are pure functions in models/, activities call them between a read and a write."""

"""The read model of the cluster for people and tools: a versioned JSON API and one web page.

- :mod:`.model` turns what the scheduler already knows (its ledger, its watch cache of Nodes,
  Pods and ResourceQuotas, the vendors) into the ``/api/v1`` documents. Pure: no I/O, ``now``
  passed in. ``hami simulate --output html`` feeds it a simulated ledger.
- :mod:`.live` scrapes the node monitors' ``/metrics`` (memory really used, utilisation) and
  keeps the last reading per node with its age; the model joins it in and marks it stale.
- :mod:`.server` serves the API, the OpenAPI document (``openapi.yaml``) and the page
  (``static/``) on the scheduler's ``--ui-bind`` listener: GET only, nothing secret.
- :mod:`.auth` signs callers in with Kubernetes bearer tokens (TokenReview) and checks their
  RBAC (SubjectAccessReview), with short bounded caches; :mod:`.scope` narrows an answer to the
  namespaces a caller may list (other tenants only as anonymous totals; pure, like the model).
- :mod:`.page` builds the page, served with its assets beside it or as one self-contained file.

Nothing here re-parses allocation annotations: allocations come from the ledger.
"""

"""`hami scheduler`: the kube-scheduler extender and the mutating admission webhook.

* :mod:`.options` - flags (HAMi's names, §7.3) and device-config.yaml, validated at start;
* :mod:`.state` - watch caches of Nodes, Pods, ResourceQuotas feeding the core's ledger;
* :mod:`.extender` - ``/filter`` and ``/bind`` (node lock, events);
* :mod:`.leader` - follows the kube-scheduler Lease (only the leader filters and binds);
* :mod:`.server` - the routes and the service behind them (the listener itself, its limits
  and certificate reload: :mod:`hami.serve`);
* :mod:`.command` - ``hami scheduler``; :mod:`.explain` - ``hami explain POD`` (its verdicts:
  :mod:`hami.core.explain`).
The webhook's rules live in :mod:`hami.webhook`.
"""

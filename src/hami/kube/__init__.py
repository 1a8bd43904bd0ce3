"""Kubernetes plumbing shared by the components: a JSON client, list+watch caches, the node lock.

* :mod:`hami.kube.client` - :class:`KubeClient`, plain-dict requests over kubernetes_asyncio;
* :mod:`hami.kube.reflector` - :class:`Reflector`, list+watch resumed on expiry (410);
* :mod:`hami.kube.nodelock` - the ``hami.io/mutex.lock`` node lock (value format, owner, expiry).
"""

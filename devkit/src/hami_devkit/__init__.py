"""hami-devkit: the test harness of hami, kept out of the product wheel and image.

What it owns: the local Kubernetes the tests run against (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok; :mod:`hami_devkit.cluster`), the real node
(kubelet, containerd, runc, kube-proxy; :mod:`hami_devkit.realnode`), the OCI image builder
(:mod:`hami_devkit.images`, behind ``make images``), the kubelet device-manager stand-in
(:mod:`hami_devkit.kubelet_standin`) and the ``hami-dev cluster up|down|env|status`` command
(:mod:`hami_devkit.command`, also ``python -m hami_devkit``).

What it does not own: anything a user deploys. It may import ``hami`` (the stand-in speaks the
product's kubelet API stubs); ``hami`` never imports it, and
``tests/unit/test_packaging.py`` checks both that and the wheel's contents.
"""

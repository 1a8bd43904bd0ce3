#!/usr/bin/env bash
# Placeholder: installs etcd, kube-apiserver, kube-scheduler, kwok and helm into the cache.
exit 0

"""The mutating admission webhook's rules (``POST /webhook``, served by ``hami scheduler``).

:func:`hami.webhook.admission.review` turns an ``admission.k8s.io/v1`` AdmissionReview into the
response (allowed/denied, JSON patch). HAMi's rules (§3.2-§3.3) plus two security denials.
"""

from .admission import AdmissionSettings, decide, json_patch, review

__all__ = ["AdmissionSettings", "decide", "json_patch", "review"]

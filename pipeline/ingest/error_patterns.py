"""Default error-class patterns of the classifier (SPEC §4.1): provider wording, English and Chinese.

Data only: :data:`DEFAULT_PATTERNS` maps a provider (``"*"``: every provider) to
``{class: (pattern, ...)}``; :mod:`pipeline.ingest.error_class` compiles them.
Every default is a plain phrase (matched case-insensitively as a substring,
``re.escape``-d), so no default can backtrack. Sources, one per group:

- [openai] OpenAI "Error codes" guide (platform.openai.com/docs/guides/error-codes) and
  openai/openai-python ``_exceptions.py`` (401 AuthenticationError, 403 PermissionDeniedError,
  429 RateLimitError, 400/404/409/422 client errors, ``insufficient_quota``, ``invalid_api_key``,
  "Incorrect API key provided", "You exceeded your current quota", "Rate limit reached for",
  ``context_length_exceeded`` / "maximum context length is N tokens").
- [azure] Azure OpenAI quota docs: "Requests to the ... have exceeded call rate limit",
  "Access denied due to invalid subscription key", "content_filter"; litellm
  ``exception_mapping_utils.py`` (BerriAI/litellm) Azure branch.
- [anthropic] docs.anthropic.com "Errors": ``invalid_request_error`` 400, ``authentication_error`` 401,
  ``permission_error`` 403, ``not_found_error`` 404, ``request_too_large`` 413,
  ``rate_limit_error`` 429, ``api_error`` 500, ``overloaded_error`` 529; "Your credit balance is
  too low to access the Anthropic API"; "prompt is too long".
- [gemini] ai.google.dev "Troubleshooting": 400 INVALID_ARGUMENT / FAILED_PRECONDITION, "API key not
  valid. Please pass a valid API key." (API_KEY_INVALID), 403 PERMISSION_DENIED, 429
  RESOURCE_EXHAUSTED ("Resource has been exhausted (e.g. check quota)." is a rate limit;
  "Quota exceeded for metric ... PerDay" is the day's quota), 500 INTERNAL, 503 UNAVAILABLE.
- [deepseek] api-docs.deepseek.com "Error Codes": 400 Invalid Format, 401 Authentication Fails,
  402 Insufficient Balance, 422 Invalid Parameters, 429 Rate Limit Reached, 500 Server Error,
  503 Server Overloaded.
- [moonshot] platform.moonshot.cn "错误说明": ``invalid_authentication_error``,
  ``exceeded_current_quota_error``, ``rate_limit_reached_error``, ``engine_overloaded_error``,
  ``permission_denied_error``, "Your request exceeded model token limit", "suspended".
- [zhipu] open.bigmodel.cn "错误码": 1000-1004 身份验证失败 / Authorization Token非法 / Token已过期,
  1113 您的账户已欠费 / 余额不足或无可用资源包, 1261 Prompt 超长, 1302 并发数过高, 1303 请求频率过高,
  1305 该模型当前访问量过大.
- [dashscope] help.aliyun.com "百炼 错误码": ``InvalidApiKey`` "Invalid API-key provided.",
  ``Arrearage`` "Access denied, please make sure your account is in good standing.",
  ``AllocationQuota.FreeTierOnly`` "The free tier of the model has been exhausted",
  ``Throttling.RateQuota`` "Requests rate limit exceeded", ``InvalidParameter`` "Range of input
  length should be", ``InternalError``.
- [baidu] cloud.baidu.com Qianfan "错误码": 17 "Open api daily request limit reached",
  18 "Open api qps request limit reached", 19 "Open api total request limit reached",
  110 "Access token invalid or no longer valid", 111 "Access token expired",
  336103 "the max input characters is", 336501/336502 rpm/tpm limit, 336000 internal error.
- [relay] QuantumNous/new-api ``service/channel.go`` ShouldDisableChannel and its default
  AutomaticDisableKeywords ("Your credit balance is too low", "This organization has been disabled.",
  "You exceeded your current quota", "Permission denied", "The security token included in the
  request is invalid", "Your account is not authorized"), its relay codes ``insufficient_user_quota``
  "用户额度不足", ``pre_consume_token_quota_failed``; songquanpeng/one-api ``relay/controller`` /
  ``monitor/manage.go`` ShouldDisableChannel ("api key not valid", "api key expired", "已欠费",
  "organization has been restricted", "your access was terminated") and ``model/token.go``
  ("该令牌额度已用尽", "该令牌已过期", "该令牌状态不可用", "无效的令牌"). Checked against the sources
  (issue #32 part 1): new-api ``setting/operation_setting/operation_setting.go``
  AutomaticDisableKeywords also holds "Permission denied" and "Operation not allowed", and its
  ``AutomaticDisableIgnoreKeywords`` ("requests are too frequent", "reduce your request frequency",
  "too many requests", "rate limit", "request frequency") are the rate-limit wordings it must not
  disable on; one-api ``monitor/manage.go`` ShouldDisableChannel: 401, types ``insufficient_quota``,
  ``authentication_error``, ``permission_error``, ``forbidden``, codes ``invalid_api_key``,
  ``account_deactivated``, and "violation of our policies" (its bare "credit" / "balance" substrings
  are too loose to copy: "balance" also appears in load-balancer messages).
- [litellm] BerriAI/litellm ``litellm/exceptions.py`` class names, which a LiteLLM callback reports as
  ``error_type`` (``litellm_core_utils/exception_mapping_utils.py`` maps provider errors onto them):
  ``AuthenticationError`` 401, ``PermissionDeniedError`` 403, ``RateLimitError`` 429,
  ``ContextWindowExceededError`` / ``BadRequestError`` / ``UnprocessableEntityError`` /
  ``ContentPolicyViolationError`` 400-422, ``NotFoundError`` 404.

Order of the classes at match time is fixed (:data:`CLASS_ORDER` in
:mod:`pipeline.ingest.error_class`), not the order of this table.
"""

from __future__ import annotations

_QUOTA = (
    # [openai] / [relay]
    "insufficient_quota", "exceeded your current quota", "billing_hard_limit_reached", "billing_not_active",
    "insufficient_user_quota", "pre_consume_token_quota_failed", "user quota is not enough",
    # [anthropic] / [relay]
    "credit balance is too low",
    # [deepseek]
    "insufficient balance", "insufficient_balance",
    # [moonshot]
    "exceeded_current_quota_error",
    # [dashscope]
    "arrearage", "account is in good standing", "freetieronly", "free tier of the model has been exhausted",
    # [baidu]
    "open api daily request limit reached", "open api total request limit reached",
    # [zhipu] / [relay] / Chinese wording
    "余额不足", "已欠费", "欠费", "额度已用尽", "额度不足", "配额已用完", "无可用资源包", "quota_exhausted",
    # [relay] new-api business-error wording
    "insufficient credit", "账户余额",
)  # fmt: skip
_CREDENTIAL = (
    # [openai] / [relay]
    "invalid_api_key", "incorrect api key provided", "invalid api key", "account_deactivated",
    "organization has been disabled", "your access was terminated", "organization has been restricted",
    "the security token included in the request is invalid", "your account is not authorized",
    # [anthropic]
    "authentication_error", "permission_error", "invalid x-api-key",
    # [azure]
    "invalid subscription key",
    # [gemini] / [relay]
    "api key not valid", "api_key_invalid", "api key expired",
    # [deepseek]
    "authentication fails",
    # [moonshot]
    "invalid_authentication_error", "permission_denied_error",
    # [dashscope]
    "invalidapikey", "invalid api-key",
    # [baidu]
    "access token invalid", "access token expired",
    # [zhipu] / [relay] / Chinese wording
    "身份验证失败", "authorization token非法", "token已过期", "令牌已过期", "令牌状态不可用", "无效的令牌",
    "api key无效", "密钥无效",
    # [relay] new-api / one-api disable keywords
    "permission denied", "operation not allowed", "violation of our policies",
    # [litellm]
    "authenticationerror", "permissiondeniederror",
)  # fmt: skip
_RATE = (
    # [openai] / [azure]
    "rate limit reached for", "rate_limit_exceeded", "exceeded call rate limit", "too many requests",
    # [anthropic]
    "rate_limit_error",
    # [deepseek] / [moonshot]
    "rate limit reached", "rate_limit_reached_error",
    # [dashscope]
    "throttling", "requests rate limit exceeded",
    # [baidu]
    "open api qps request limit reached", "rpm limit", "tpm limit",
    # [zhipu] / Chinese wording
    "并发数过高", "请求频率过高", "频率限制", "限流",
    # [relay] new-api AutomaticDisableIgnoreKeywords / [litellm]
    "requests are too frequent", "reduce your request frequency", "rate limit", "ratelimiterror",
)  # fmt: skip
_CALLER = (
    # [openai]
    "context_length_exceeded", "maximum context length", "invalid_request_error", "string_above_max_length",
    # [anthropic]
    "prompt is too long", "request_too_large",
    # [gemini]
    "invalid_argument",
    # [deepseek] / [moonshot]
    "invalid format", "invalid parameters", "exceeded model token limit",
    # [dashscope]
    "range of input length should be", "invalidparameter",
    # [baidu]
    "the max input characters is",
    # [zhipu] / Chinese wording
    "prompt 超长", "上下文长度", "超过最大长度", "参数错误", "参数非法",
    # [litellm]
    "contextwindowexceedederror", "contentpolicyviolationerror", "badrequesterror", "unprocessableentityerror",
)  # fmt: skip
_TRANSIENT = (
    # [anthropic] / [deepseek] / [moonshot] / [gemini] / [zhipu]
    "overloaded_error", "server overloaded", "engine_overloaded_error", "unavailable", "访问量过大",
    "internal server error", "internalerror", "bad gateway", "gateway timeout", "connection reset",
    "connection refused", "timed out", "timeout",
)  # fmt: skip

_GEMINI = {
    # [gemini]: a per-minute RESOURCE_EXHAUSTED is a rate limit even when it says "quota";
    # the day's quota (PerDay metrics) is gone until the next day.
    "quota_exhausted": ("perday", "per day"),
    "rate_limited": ("perminute", "per minute", "resource has been exhausted", "please retry in"),
}

#: Provider → class → phrases (``"*"``: all providers). Provider tables are tried before ``"*"``.
DEFAULT_PATTERNS: dict[str, dict[str, tuple[str, ...]]] = {
    "*": {
        "quota_exhausted": _QUOTA,
        "credential": _CREDENTIAL,
        "rate_limited": _RATE,
        "caller": _CALLER,
        "transient": _TRANSIENT,
    },
    "gemini": _GEMINI,
    "google": _GEMINI,
    "vertex": _GEMINI,
}

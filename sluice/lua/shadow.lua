-- A TrafficSplitter's shadow: a copy of the request, sent to the shadow API's path at the proxy's
-- own address and forgotten (its answer is read and dropped), as Cortex's shadow was a mirror.
--
--   http-request lua.sluice_shadow <http or https>://<proxy host:port> /<shadow api> <splitter>
--
-- The rule runs after `http-request wait-for-body`, so the body is whole when it fits haproxy's
-- buffer; a body that does not fit is not copied (a truncated copy would be a different request),
-- and that is logged. The copy keeps the request's query, Content-Type, Authorization (the shadow's
-- backend checks the key like any other) and X-Request-ID (so the two can be matched in the logs),
-- and says whose shadow it is in X-Sluice-Shadow-Of. It is sent from a task of its own, so the
-- client's request never waits for it.

local COPIED_HEADERS = { "content-type", "authorization", "x-request-id" }

core.register_action("sluice_shadow", { "http-req" }, function(txn, address, path, splitter)
  local method = txn.f:method()
  if method ~= "GET" and method ~= "POST" then
    return
  end
  local body = txn.f:req_body() or ""
  local expected = tonumber(txn.f:req_body_size() or 0) or 0
  if #body < expected then
    txn:Warning("sluice: shadow copy to " .. path .. " skipped: the body (" .. expected ..
                " bytes) is larger than the proxy's buffer")
    return
  end
  local url = address .. path
  local query = txn.f:query()
  if query ~= nil and query ~= "" then
    url = url .. "?" .. query
  end
  local given = txn.http:req_get_headers()
  -- Closed once answered, so that a reload or stop never waits on an idle copy connection.
  local headers = { ["x-sluice-shadow-of"] = { splitter }, ["connection"] = { "close" } }
  for _, name in ipairs(COPIED_HEADERS) do
    if given[name] ~= nil and given[name][0] ~= nil then
      headers[name] = { given[name][0] }
    end
  end
  if method == "POST" then
    headers["content-length"] = { tostring(#body) }
  end
  core.register_task(function()
    local client = core.httpclient()
    if method == "POST" then
      client:post{ url = url, headers = headers, body = body }
    else
      client:get{ url = url, headers = headers }
    end
  end)
end, 3)

-- Argo CD health of a ProcessingRun (processing.runledger.dev/v1alpha1).
-- Complete -> Healthy; Failed -> Degraded; Stalled (a missing Secret or
-- ConfigMap, an image that cannot be pulled) -> Degraded; Suspended ->
-- Suspended; anything else -> Progressing.
local hs = {}

local function condition(status, type)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function counts(status)
  return string.format("%d/%d completed, %d already handled, %d failed",
    status.completed or 0, status.total or 0, status.alreadyHandled or 0, status.failed or 0)
end

local status = obj.status
if status == nil or status.observedGeneration == nil or
    (obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the run"
  return hs
end

local failed = condition(status, "Failed")
if failed ~= nil and failed.status == "True" then
  hs.status = "Degraded"
  hs.message = failed.message
  return hs
end

local complete = condition(status, "Complete")
if complete ~= nil and complete.status == "True" then
  hs.status = "Healthy"
  hs.message = counts(status)
  return hs
end

local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message
  return hs
end

local suspended = condition(status, "Suspended")
if suspended ~= nil and suspended.status == "True" then
  hs.status = "Suspended"
  hs.message = suspended.message
  return hs
end

hs.status = "Progressing"
hs.message = (status.phase or "Pending") .. ": " .. counts(status)
return hs

-- Argo CD health of a ProcessingSchedule (processing.runledger.dev/v1alpha1).
-- Stalled (an unknown time zone, a schedule robfig/cron refuses, a run name
-- taken) -> Degraded; Suspended -> Suspended; Ready -> Healthy; anything
-- else (not yet observed, catching up) -> Progressing.
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

local status = obj.status
if status == nil or status.observedGeneration == nil or
    (obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the schedule"
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

local reconciling = condition(status, "Reconciling")
local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "True" and (reconciling == nil or reconciling.status ~= "True") then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end

hs.status = "Progressing"
if reconciling ~= nil then
  hs.message = reconciling.message
end
return hs

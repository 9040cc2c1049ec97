-- Put before every script that takes a time (lib.rs joins them).
-- The caller's time in ms, or Redis's own when the caller sends ''.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


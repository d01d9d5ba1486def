-- Wireshark dissector for the vStellar engine's wire format (version 1).
-- Reference: docs/wire-format.md. Install: copy to ~/.local/lib/wireshark/plugins/
-- or run `wireshark -X lua_script:tools/wireshark/vstellar.lua`.
-- Registered on the harness's default base ports and as a UDP heuristic
-- dissector, since source ports (paths) vary per packet.

local p = Proto("vstellar", "vStellar RNIC transport")

local opcodes = {
  [1] = "SEND", [2] = "SEND_IMM", [3] = "WRITE", [4] = "WRITE_IMM", [5] = "READ_REQ",
  [6] = "READ_RESP", [7] = "CMP_SWAP", [8] = "FETCH_ADD", [9] = "ATOMIC_RESP", [10] = "ACK",
  [11] = "UD_SEND", [12] = "UD_SEND_IMM", [13] = "SEND_INV",
}
local syndromes = {
  [0] = "ACK", [1] = "RNR NAK", [2] = "NAK invalid request", [3] = "NAK remote access",
  [4] = "NAK remote operational error",
}
local ext_len = { [1] = 32, [2] = 32, [3] = 32, [4] = 32, [5] = 24, [6] = 8, [7] = 32, [8] = 32, [9] = 8, [10] = 28, [11] = 48, [12] = 48, [13] = 32 }

local f = p.fields
f.version = ProtoField.uint8("vstellar.version", "Version", base.DEC, nil, 0xF0)
f.opcode = ProtoField.uint8("vstellar.opcode", "Opcode", base.DEC, opcodes)
f.flags = ProtoField.uint16("vstellar.flags", "Flags", base.HEX)
f.f_first = ProtoField.bool("vstellar.flags.first", "FIRST", 16, nil, 0x0001)
f.f_last = ProtoField.bool("vstellar.flags.last", "LAST", 16, nil, 0x0002)
f.f_sol = ProtoField.bool("vstellar.flags.solicited", "SOLICITED", 16, nil, 0x0004)
f.f_retx = ProtoField.bool("vstellar.flags.retx", "RETX", 16, nil, 0x0008)
f.f_probe = ProtoField.bool("vstellar.flags.probe", "PROBE", 16, nil, 0x0010)
f.dst_qpn = ProtoField.uint32("vstellar.dst_qpn", "Destination QPN", base.HEX)
f.src_qpn = ProtoField.uint32("vstellar.src_qpn", "Source QPN", base.HEX)
f.psn = ProtoField.uint32("vstellar.psn", "PSN", base.DEC)
f.path = ProtoField.uint16("vstellar.path", "Path", base.DEC)
f.payload_len = ProtoField.uint16("vstellar.payload_len", "Payload length", base.DEC)
f.ts = ProtoField.uint32("vstellar.ts", "Timestamp (us)", base.DEC)
f.va = ProtoField.uint64("vstellar.va", "Virtual address", base.HEX)
f.rkey = ProtoField.uint32("vstellar.rkey", "RKey", base.HEX)
f.msg_off = ProtoField.uint32("vstellar.msg_off", "Message offset", base.DEC)
f.msg_len = ProtoField.uint32("vstellar.msg_len", "Message length", base.DEC)
f.rsn = ProtoField.uint32("vstellar.rsn", "Receive sequence number", base.DEC)
f.imm = ProtoField.uint32("vstellar.imm", "Immediate", base.HEX)
f.len = ProtoField.uint32("vstellar.len", "Length", base.DEC)
f.seg = ProtoField.uint16("vstellar.seg", "Segment size", base.DEC)
f.swap_add = ProtoField.uint64("vstellar.swap_add", "Swap / add", base.HEX)
f.compare = ProtoField.uint64("vstellar.compare", "Compare", base.HEX)
f.orig = ProtoField.uint64("vstellar.orig", "Original value", base.HEX)
f.cum_psn = ProtoField.uint32("vstellar.ack.cum_psn", "Cumulative PSN", base.DEC)
f.sack_base = ProtoField.uint32("vstellar.ack.sack_base", "SACK base PSN", base.DEC)
f.sack_words = ProtoField.uint8("vstellar.ack.sack_words", "SACK words", base.DEC)
f.syndrome = ProtoField.uint8("vstellar.ack.syndrome", "Syndrome", base.DEC, syndromes)
f.ce_count = ProtoField.uint16("vstellar.ack.ce_count", "CE count", base.DEC)
f.echo_ts = ProtoField.uint32("vstellar.ack.echo_ts", "Echoed timestamp (us)", base.DEC)
f.echo_path = ProtoField.uint16("vstellar.ack.echo_path", "Echoed path", base.DEC)
f.rx_count = ProtoField.uint16("vstellar.ack.rx_count", "Packets since last ACK", base.DEC)
f.nak_psn = ProtoField.uint32("vstellar.ack.nak_psn", "NAK PSN", base.DEC)
f.rnr_us = ProtoField.uint32("vstellar.ack.rnr_us", "RNR wait (us)", base.DEC)
f.sack = ProtoField.uint64("vstellar.ack.sack", "SACK word", base.HEX)
f.sacked = ProtoField.string("vstellar.ack.sacked", "SACKed PSNs")
f.qkey = ProtoField.uint32("vstellar.ud.qkey", "Q_Key", base.HEX)
f.flow_label = ProtoField.uint32("vstellar.ud.flow_label", "Flow label", base.HEX)
f.tclass = ProtoField.uint8("vstellar.ud.traffic_class", "Traffic class", base.HEX)
f.hop_limit = ProtoField.uint8("vstellar.ud.hop_limit", "Hop limit", base.DEC)
f.sgid = ProtoField.ipv6("vstellar.ud.sgid", "Source GID")
f.dgid = ProtoField.ipv6("vstellar.ud.dgid", "Destination GID")
f.payload = ProtoField.bytes("vstellar.payload", "Payload")

local function valid(buf)
  local n = buf:len()
  if n < 24 then return false end
  if bit.rshift(buf(0, 1):uint(), 4) ~= 1 then return false end
  local op = buf(1, 1):uint()
  local el = ext_len[op]
  if not el or n < 24 + el then return false end
  local hl = 24 + el
  if op == 10 then
    local w = buf(32, 1):uint()
    if w > 16 then return false end
    hl = hl + 8 * w
  end
  return n - hl == buf(18, 2):uint()
end

function p.dissector(buf, pinfo, tree)
  if not valid(buf) then return 0 end
  pinfo.cols.protocol = "vStellar"
  local op = buf(1, 1):uint()
  local t = tree:add(p, buf(), "vStellar " .. (opcodes[op] or "?"))
  t:add(f.version, buf(0, 1))
  t:add(f.opcode, buf(1, 1))
  local ft = t:add(f.flags, buf(2, 2))
  ft:add(f.f_first, buf(2, 2)); ft:add(f.f_last, buf(2, 2))
  ft:add(f.f_sol, buf(2, 2)); ft:add(f.f_retx, buf(2, 2)); ft:add(f.f_probe, buf(2, 2))
  t:add(f.dst_qpn, buf(4, 4)); t:add(f.src_qpn, buf(8, 4))
  t:add(f.psn, buf(12, 4)); t:add(f.path, buf(16, 2))
  t:add(f.payload_len, buf(18, 2)); t:add(f.ts, buf(20, 4))
  local psn = buf(12, 4):uint()
  local info = string.format("%s QPN 0x%x PSN %u path %u", opcodes[op], buf(4, 4):uint(), psn, buf(16, 2):uint())
  local hl = 24 + ext_len[op]
  if (op >= 1 and op <= 4) or op == 13 then
    t:add(f.va, buf(24, 8)); t:add(f.rkey, buf(32, 4)); t:add(f.msg_off, buf(36, 4))
    t:add(f.msg_len, buf(40, 4)); t:add(f.rsn, buf(44, 4)); t:add(f.imm, buf(48, 4))
    info = info .. string.format(" off %u/%u", buf(36, 4):uint(), buf(40, 4):uint())
  elseif op == 5 then
    t:add(f.va, buf(24, 8)); t:add(f.rkey, buf(32, 4)); t:add(f.len, buf(36, 4))
    t:add(f.msg_off, buf(40, 4)); t:add(f.seg, buf(44, 2))
    info = info .. string.format(" len %u", buf(36, 4):uint())
  elseif op == 6 then
    t:add(f.msg_off, buf(24, 4))
  elseif op == 7 or op == 8 then
    t:add(f.va, buf(24, 8)); t:add(f.rkey, buf(32, 4))
    t:add(f.swap_add, buf(40, 8)); t:add(f.compare, buf(48, 8))
  elseif op == 9 then
    t:add(f.orig, buf(24, 8))
  elseif op == 11 or op == 12 then
    t:add(f.qkey, buf(24, 4)); t:add(f.imm, buf(28, 4)); t:add(f.flow_label, buf(32, 4))
    t:add(f.tclass, buf(36, 1)); t:add(f.hop_limit, buf(37, 1))
    t:add(f.sgid, buf(40, 16)); t:add(f.dgid, buf(56, 16))
    info = string.format("%s QPN 0x%x from QPN 0x%x path %u", opcodes[op], buf(4, 4):uint(),
                         buf(8, 4):uint(), buf(16, 2):uint())
  elseif op == 10 then
    t:add(f.cum_psn, buf(24, 4)); t:add(f.sack_base, buf(28, 4)); t:add(f.sack_words, buf(32, 1))
    t:add(f.syndrome, buf(33, 1)); t:add(f.ce_count, buf(34, 2)); t:add(f.echo_ts, buf(36, 4))
    t:add(f.echo_path, buf(40, 2)); t:add(f.rx_count, buf(42, 2)); t:add(f.nak_psn, buf(44, 4))
    t:add(f.rnr_us, buf(48, 4))
    local words = buf(32, 1):uint()
    local base_psn = buf(28, 4):uint()
    local ranges = {}
    for w = 0, words - 1 do
      local wb = buf(52 + 8 * w, 8)
      t:add(f.sack, wb)
      local hi, lo = wb(0, 4):uint(), wb(4, 4):uint()
      for b = 0, 63 do
        local set
        if b < 32 then set = bit.band(lo, bit.lshift(1, b)) ~= 0
        else set = bit.band(hi, bit.lshift(1, b - 32)) ~= 0 end
        if set then ranges[#ranges + 1] = base_psn + 64 * w + b end
      end
    end
    if #ranges > 0 then
      t:add(f.sacked, buf(52, 8 * words), string.format("%u PSNs, %u..%u", #ranges, ranges[1], ranges[#ranges]))
    end
    hl = hl + 8 * words
    local syn = buf(33, 1):uint()
    info = string.format("%s QPN 0x%x cum %u sack %u words", syndromes[syn] or "?", buf(4, 4):uint(),
                         buf(24, 4):uint(), words)
    if syn ~= 0 then info = info .. string.format(" nak_psn %u", buf(44, 4):uint()) end
  end
  if buf:len() > hl then t:add(f.payload, buf(hl)) end
  if bit.band(buf(2, 2):uint(), 8) ~= 0 then info = info .. " [RETX]" end
  if bit.band(buf(2, 2):uint(), 16) ~= 0 then info = info .. " [PROBE]" end
  pinfo.cols.info = info
  return buf:len()
end

local function heuristic(buf, pinfo, tree)
  if not valid(buf) then return false end
  p.dissector(buf, pinfo, tree)
  return true
end

local udp = DissectorTable.get("udp.port")
for _, port in ipairs({47000, 47300, 52000, 52300}) do udp:add(port, p) end
p:register_heuristic("udp", heuristic)

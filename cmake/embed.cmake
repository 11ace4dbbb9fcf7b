# SPDX-License-Identifier: MIT
# cmake -DIN=file -DOUT=header -DNAME=symbol -P embed.cmake: file's bytes as a C string.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} */\nstatic const char ${NAME}[] = { ${bytes} 0 };\n")

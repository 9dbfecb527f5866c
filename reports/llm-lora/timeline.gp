# vramlab report: gnuplot timeline.gp in this folder re-renders timeline.png
if (!exists("vl_png")) vl_png = 'timeline.png'
set terminal png size 1000,480 noenhanced
set output vl_png
set title 'Live memory during one training step: rung after (planned, full scale)'
set xlabel 'allocator event'
set ylabel 'GB'
set grid
plot 'timeline.dat' using 1:2 with lines lw 2 title 'live bytes'
